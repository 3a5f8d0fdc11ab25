// Tokenizer: the interface of every tokenizer tessera reads (text to ids and back, the vocabulary
// size, the ids of BOS/EOS), so that data preparation and generation need not know the file
// format. The kinds: tessera's own byte-level BPE (BpeTokenizerAdapter), a Hugging Face
// tokenizer.json with a byte-level BPE model (HfBpeTokenizer: GPT-2, Llama 3, Qwen2) and a
// SentencePiece tokenizer.model (SentencePieceTokenizer: Llama 2, Mistral); load_tokenizer()
// (load_tokenizer.h) picks one by file.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// The special ids a model is trained with, where the tokenizer file says which they are.
struct SpecialTokenIds {
  std::optional<uint32_t> bos;  // beginning of a sequence: <|begin_of_text|>, <s>
  std::optional<uint32_t> eos;  // end of a text: <|endoftext|>, <|end_of_text|>, </s>
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Ids of `text`, nothing added around them. Whether the text of a special token inside `text`
  // ("<|endoftext|>") becomes its id is the format's rule: yes for Hugging Face added tokens,
  // no for tessera's BPE and for SentencePiece's control symbols. Thread-safe.
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  // encode(text) with the ids the tokenizer puts around one sequence, as Hugging Face's
  // encode(text, add_special_tokens=True) does: the post-processor's template of a
  // tokenizer.json (Llama 3: <|begin_of_text|> first), BOS for SentencePiece (Llama 2's rule).
  // The default adds nothing.
  virtual std::vector<uint32_t> encode_with_special_tokens(std::string_view text) const {
    return encode(text);
  }
  // Text of the ids; special tokens decode to their text. Throws ConfigError for an id that is
  // not in the vocabulary.
  virtual std::string decode(std::span<const uint32_t> ids) const = 0;
  // One more than the largest id: the rows an embedding needs.
  virtual int vocab_size() const = 0;
  virtual SpecialTokenIds special_tokens() const = 0;
  // The format, for messages: "tessera-bpe", "hf-byte-level-bpe" or "sentencepiece".
  virtual std::string_view kind() const = 0;

 protected:
  // Copies only through the concrete classes (no slicing through a Tokenizer&).
  Tokenizer() = default;
  Tokenizer(const Tokenizer&) = default;
  Tokenizer(Tokenizer&&) = default;
  Tokenizer& operator=(const Tokenizer&) = default;
  Tokenizer& operator=(Tokenizer&&) = default;
};

}  // namespace tessera::data
