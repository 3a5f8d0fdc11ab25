// The tokenizer fixtures of tests/fixtures/tokenizers/ (made by
// scripts/fixtures/make_tokenizer_fixtures.py): the files, and expected.json with what the
// reference libraries (Hugging Face tokenizers, SentencePiece) give for every test text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::data::testing {

std::filesystem::path tokenizer_fixture_dir();
// expected.json, parsed once.
const nlohmann::json& tokenizer_expected();
// expected.json's entry for one tokenizer ("gpt2", "llama3", "qwen2", "sp_bpe", "sp_unigram").
const nlohmann::json& tokenizer_reference(const std::string& name);
// The path of that tokenizer's file.
std::filesystem::path tokenizer_fixture_file(const std::string& name);
std::vector<uint32_t> ids_of(const nlohmann::json& array);

}  // namespace tessera::data::testing
