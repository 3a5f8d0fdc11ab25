// load_tokenizer picks the reader by the file (and, in a directory, by which files are there),
// and every kind works through the Tokenizer interface.
#include "tessera/data/load_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tessera/core/error.h"
#include "tessera/data/bpe_tokenizer.h"
#include "test_util.h"
#include "tokenizer_fixtures.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using testing::ids_of;
using testing::TempDir;
using testing::tokenizer_fixture_dir;
using testing::tokenizer_fixture_file;
using testing::tokenizer_reference;

void copy_fixture(const fs::path& from, const fs::path& to) {
  testing::write_file(to, testing::read_file(from));
}

TEST(LoadTokenizer, PicksTheReaderByFileOrDirectory) {
  const std::pair<const char*, const char*> fixtures[] = {{"gpt2", "hf-byte-level-bpe"},
                                                          {"llama3", "hf-byte-level-bpe"},
                                                          {"qwen2", "hf-byte-level-bpe"},
                                                          {"sp_bpe", "sentencepiece"},
                                                          {"sp_unigram", "sentencepiece"}};
  for (const auto& [name, kind] : fixtures) {
    SCOPED_TRACE(name);
    const auto& c = tokenizer_reference(name).at("cases").at("multilingual");
    for (const fs::path& path : {tokenizer_fixture_file(name), tokenizer_fixture_dir() / name}) {
      const auto tok = load_tokenizer(path);
      EXPECT_EQ(tok->kind(), kind);
      EXPECT_EQ(tok->vocab_size(), tokenizer_reference(name).at("vocab_size").get<int>());
      EXPECT_EQ(tok->encode(c.at("text").get<std::string>()), ids_of(c.at("ids")));
      EXPECT_EQ(tok->encode_with_special_tokens(c.at("text").get<std::string>()),
                ids_of(c.at("ids_with_special")));
      EXPECT_EQ(tok->decode(ids_of(c.at("ids"))), c.at("decoded").get<std::string>());
    }
  }
}

TEST(LoadTokenizer, ReadsTesserasOwnTokenizerJson) {
  TempDir dir;
  const BpeTokenizer bpe = BpeTokenizer::train(testing::small_corpus(), {.vocab_size = 300});
  bpe.save(dir / "tokenizer.json");
  for (const fs::path& path : {dir / "tokenizer.json", dir.path()}) {
    const auto tok = load_tokenizer(path);
    EXPECT_EQ(tok->kind(), "tessera-bpe");
    EXPECT_EQ(tok->vocab_size(), 300);
    EXPECT_EQ(tok->special_tokens().eos, bpe.end_of_text());
    EXPECT_FALSE(tok->special_tokens().bos.has_value());
    EXPECT_EQ(tok->encode("the cat sat"), bpe.encode("the cat sat"));
    EXPECT_EQ(tok->encode_with_special_tokens("the cat sat"), bpe.encode("the cat sat"));
  }
}

TEST(LoadTokenizer, ADirectoryPrefersTheModelOverANonByteLevelTokenizerJson) {
  // Llama 2's layout: a Metaspace tokenizer.json converted from the tokenizer.model beside it.
  TempDir dir;
  copy_fixture(tokenizer_fixture_file("sp_bpe"), dir / "tokenizer.model");
  testing::write_file(dir / "tokenizer.json",
                      R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                          "pre_tokenizer": {"type": "Metaspace"}, "decoder": {"type": "Metaspace"}})");
  EXPECT_EQ(load_tokenizer(dir.path())->kind(), "sentencepiece");
  // The file itself, named, is read as what it is: refused with the reason.
  EXPECT_THROW(load_tokenizer(dir / "tokenizer.json"), ConfigError);
  // A byte-level tokenizer.json wins over a tokenizer.model.
  copy_fixture(tokenizer_fixture_file("llama3"), dir / "tokenizer.json");
  EXPECT_EQ(load_tokenizer(dir.path())->kind(), "hf-byte-level-bpe");
}

TEST(LoadTokenizer, TokenizerConfigJsonNamesBosAndEos) {
  TempDir dir;
  copy_fixture(tokenizer_fixture_file("llama3"), dir / "tokenizer.json");
  const auto& special = tokenizer_reference("llama3").at("special_tokens");
  {
    const auto tok = load_tokenizer(dir.path());
    EXPECT_EQ(tok->special_tokens().bos, special.at("<|begin_of_text|>").get<uint32_t>());
    EXPECT_EQ(tok->special_tokens().eos, special.at("<|end_of_text|>").get<uint32_t>());
  }
  testing::write_file(dir / "tokenizer_config.json",
                      R"({"bos_token": null, "eos_token": {"content": "<|eot_id|>"}})");
  {
    const auto tok = load_tokenizer(dir / "tokenizer.json");
    EXPECT_FALSE(tok->special_tokens().bos.has_value());
    EXPECT_EQ(tok->special_tokens().eos, special.at("<|eot_id|>").get<uint32_t>());
  }
  testing::write_file(dir / "tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  EXPECT_THROW(load_tokenizer(dir.path()), IoError);
}

TEST(LoadTokenizer, NothingThereIsAnIoErrorNamingThePath) {
  TempDir dir;
  try {
    load_tokenizer(dir.path());
    FAIL() << "an empty directory loaded";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()), "the directory " + dir.path().string() +
                                         " holds no tokenizer: neither tokenizer.json nor "
                                         "tokenizer.model");
  }
  EXPECT_THROW(load_tokenizer(dir / "missing.json"), IoError);
  testing::write_file(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\"");
  EXPECT_THROW(load_tokenizer(dir.path()), IoError);
}

}  // namespace
}  // namespace tessera::data
