// load_tokenizer: the tokenizer a path names, whatever its format, picked by the file itself:
//   * a JSON file with "format": "tessera-bpe": tessera's own BPE (BpeTokenizerAdapter);
//   * another JSON file (a Hugging Face tokenizer.json): HfBpeTokenizer, with BOS/EOS from a
//     tokenizer_config.json beside it when there is one;
//   * any other file (a SentencePiece tokenizer.model is binary protobuf): SentencePieceTokenizer;
//   * a directory: its tokenizer.json, or its tokenizer.model when there is no tokenizer.json or
//     when the tokenizer.json is not byte-level (Llama 2's and Mistral's hold a Metaspace
//     pipeline converted from the tokenizer.model beside them; the model is then the source).
#pragma once

#include <filesystem>
#include <memory>

#include "tessera/data/tokenizer.h"

namespace tessera::data {

// Throws IoError when nothing readable is there or the file is malformed, ConfigError when the
// file uses what tessera does not support; both name the file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

}  // namespace tessera::data
