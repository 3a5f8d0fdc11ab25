// HfBpeTokenizer: a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3,
// Qwen2, ...), giving the ids Hugging Face's `tokenizers` gives. Encoding: added tokens are cut
// out of the text first (never split), the Split regexes and ByteLevel cut the rest into pieces
// (regex_splitter.h, PCRE2), the BPE model encodes each piece (byte_level_bpe_model.h); with
// special tokens, the post-processor's template goes around the ids (Llama 3's
// <|begin_of_text|>). Decoding gives the bytes of the tokens (ByteLevel decoder) and the text of
// the added tokens. What the file may hold: hf_tokenizer_json.h and docs/FORMATS.md.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/data/added_tokens.h"
#include "tessera/data/byte_level_bpe_model.h"
#include "tessera/data/hf_tokenizer_json.h"
#include "tessera/data/regex_splitter.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {

class HfBpeTokenizer final : public Tokenizer {
 public:
  // Throws IoError for a file that is not a valid tokenizer.json (or cannot be read) and
  // ConfigError for one that uses what tessera does not support, both naming `source`/the path.
  HfBpeTokenizer(const HfTokenizerJson& spec, const std::string& source);
  static HfBpeTokenizer from_json(std::string_view json_text, const std::string& source);
  static HfBpeTokenizer load(const std::filesystem::path& path);

  // Added tokens in the text become their ids; the rest is never an added token's id. Text that
  // is not valid UTF-8 is encoded too (its bytes; the reference libraries take only Unicode
  // text), and decode gives it back.
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::vector<uint32_t> encode_with_special_tokens(std::string_view text) const override;
  // The bytes of the tokens, added tokens as their text. Where Hugging Face replaces bytes that
  // are not valid UTF-8 (a token holding part of a character, decoded alone) with U+FFFD, this
  // returns the bytes themselves, so decodes of consecutive pieces concatenate to the whole.
  std::string decode(std::span<const uint32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(vocab_size_); }
  // bos: the first id the template puts before the text; eos: the first special added token of
  // <|end_of_text|>, <|endoftext|>, </s>. A tokenizer_config.json knows better:
  // set_special_tokens.
  SpecialTokenIds special_tokens() const override { return special_; }
  void set_special_tokens(const SpecialTokenIds& ids) { special_ = ids; }
  std::string_view kind() const override { return "hf-byte-level-bpe"; }

  // The id of a token as the file writes it (an added token's content, or a vocabulary entry
  // in byte-level characters: "Ġthe").
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  const std::vector<AddedToken>& added_tokens() const { return added_.tokens(); }
  const std::vector<uint32_t>& template_prefix() const { return template_prefix_; }
  const std::vector<uint32_t>& template_suffix() const { return template_suffix_; }

 private:
  struct EncodeState;
  void pre_tokenize(std::string_view piece, std::size_t stage, EncodeState& state) const;
  void encode_piece_cached(std::string_view piece, EncodeState& state) const;

  std::string source_;
  ByteLevelBpeModel model_;
  AddedTokenMatcher added_;
  std::vector<RegexSplitter> splits_;
  std::optional<RegexSplitter> byte_level_regex_;
  bool add_prefix_space_ = false;
  std::vector<uint32_t> template_prefix_, template_suffix_;
  uint32_t vocab_size_ = 0;
  SpecialTokenIds special_;
};

}  // namespace tessera::data
