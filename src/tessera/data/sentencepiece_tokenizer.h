// SentencePieceTokenizer: a SentencePiece tokenizer.model (Llama 2, Mistral v0.1, ...) through
// the SentencePiece library itself (Debian's libsentencepiece-dev), so the ids are the library's:
// its normaliser, BPE or unigram model and byte fallback as the file says. Encoding with special
// tokens puts BOS first (Llama 2's rule; EOS is not added). Control symbols such as "<s>" written
// in the text stay text, as in SentencePiece.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "tessera/data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tessera::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Throws IoError naming the file (or `source`) when it cannot be read or is not a
  // SentencePiece model.
  static SentencePieceTokenizer load(const std::filesystem::path& path);
  static SentencePieceTokenizer from_serialized(std::string_view model_bytes,
                                                const std::string& source);

  // SentencePiece reads the text as UTF-8 and replaces ill-formed bytes with U+FFFD, so such
  // text does not come back byte for byte.
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::vector<uint32_t> encode_with_special_tokens(std::string_view text) const override;
  // SentencePiece's decoding: control tokens (BOS, EOS) decode to nothing, byte pieces are
  // joined into characters, the leading space of the dummy prefix is dropped.
  std::string decode(std::span<const uint32_t> ids) const override;
  int vocab_size() const override { return vocab_size_; }
  SpecialTokenIds special_tokens() const override { return special_; }
  std::string_view kind() const override { return "sentencepiece"; }

  // The piece of an id ("▁the", "<0x0A>", "<s>"); throws ConfigError for an id out of range.
  std::string id_to_piece(uint32_t id) const;

 private:
  SentencePieceTokenizer(std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp,
                         std::string source);
  void check_ids(std::span<const uint32_t> ids) const;

  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;  // thread-safe when const
  std::string source_;
  int vocab_size_ = 0;
  SpecialTokenIds special_;
};

}  // namespace tessera::data
