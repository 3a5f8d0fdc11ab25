// Reading a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, Qwen2, ...)
// into the parts HfBpeTokenizer is built from. Every part of the file that changes the ids is
// either understood or refused: a model or pipeline step tessera does not reproduce exactly is a
// ConfigError naming it and what is supported; a file that is not a valid tokenizer.json (bad
// JSON, missing fields, a merge naming an unknown token) is an IoError. Both start with `source`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/data/added_tokens.h"
#include "tessera/data/byte_level_bpe_model.h"

namespace tessera::data {

struct HfTokenizerJson {
  // A Split pre-tokenizer (behavior Isolated): a regex, or with `literal` a plain string.
  struct Split {
    std::string pattern;
    bool literal = false;
  };

  // model (type BPE): the vocabulary and merges as written (byte-level characters).
  std::vector<std::pair<std::string, uint32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  ByteLevelBpeModel::Options model_options;
  std::vector<AddedToken> added_tokens;
  // pre_tokenizer: the Split steps in order, then ByteLevel (with its own GPT-2 regex when
  // use_regex is true, and a space put before each piece without one when add_prefix_space is).
  std::vector<Split> splits;
  bool byte_level_use_regex = true;
  bool add_prefix_space = false;
  // post_processor: what encode with special tokens puts before and after the ids of one text
  // (TemplateProcessing's "single"; empty for ByteLevel or none).
  std::vector<uint32_t> template_prefix;
  std::vector<uint32_t> template_suffix;
};

// Reads the text of a tokenizer.json; `source` (the file's path) starts every message.
HfTokenizerJson parse_hf_tokenizer_json(std::string_view json_text, const std::string& source);

// The pattern Hugging Face's ByteLevel pre-tokenizer uses when use_regex is true (not written in
// the file): GPT-2's, from its encoder.py.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace tessera::data
