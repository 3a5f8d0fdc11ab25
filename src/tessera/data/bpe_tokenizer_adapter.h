// BpeTokenizerAdapter: tessera's own byte-level BPE (bpe_tokenizer.h) behind the Tokenizer
// interface. An adapter rather than a base class of BpeTokenizer: bpe_tokenizer.h is an installed
// public header, and tokenizer.h is not (yet) one. Its end-of-text id is the EOS; it has no BOS,
// and encoding with special tokens adds nothing.
#pragma once

#include <utility>

#include "tessera/data/bpe_tokenizer.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {

class BpeTokenizerAdapter final : public Tokenizer {
 public:
  explicit BpeTokenizerAdapter(BpeTokenizer bpe) : bpe_(std::move(bpe)) {}

  std::vector<uint32_t> encode(std::string_view text) const override { return bpe_.encode(text); }
  std::string decode(std::span<const uint32_t> ids) const override { return bpe_.decode(ids); }
  int vocab_size() const override { return bpe_.vocab_size(); }
  SpecialTokenIds special_tokens() const override { return {.bos = {}, .eos = bpe_.end_of_text()}; }
  std::string_view kind() const override { return "tessera-bpe"; }

  const BpeTokenizer& bpe() const { return bpe_; }

 private:
  BpeTokenizer bpe_;
};

}  // namespace tessera::data
