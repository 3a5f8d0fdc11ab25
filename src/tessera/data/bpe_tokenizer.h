// Byte-level BPE tokenizer: ids 0..255 are the bytes, then one id per learned merge, then
// (optionally) the end-of-text token as the last id. See docs/DATA.md for the file format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera::data {

inline constexpr uint32_t kNumByteTokens = 256;
inline constexpr std::string_view kEndOfTextText = "<|endoftext|>";

struct BpeTrainOptions {
  // Total vocabulary size, end-of-text token included: 256 + merges (+ 1).
  int vocab_size = 512;
  // Reserve id vocab_size-1 as <|endoftext|>, which encode_documents() puts after every document.
  bool end_of_text = true;
};

class BpeTokenizer {
 public:
  using Merge = std::pair<uint32_t, uint32_t>;

  // The byte-only tokenizer: 256 ids, no merges, no end-of-text token.
  BpeTokenizer();
  // A tokenizer from its merges (merge i creates id 256 + i from two earlier ids). Throws
  // ConfigError when a merge names an id that does not exist yet.
  BpeTokenizer(std::vector<Merge> merges, bool end_of_text);

  // Learns merges from the documents until the vocabulary holds options.vocab_size ids. Pair
  // counts are taken over the pre-tokenised chunks (see pretokenizer.h); the most frequent pair
  // wins, ties go to the smallest (left id, right id). Throws ConfigError when vocab_size is out
  // of range or the corpus has too few distinct pairs to reach it.
  static BpeTokenizer train(std::span<const std::string> documents, const BpeTrainOptions& options);
  static BpeTokenizer train(std::string_view text, const BpeTrainOptions& options);

  // Tokens of `text`; never emits the end-of-text id (its literal text is encoded as bytes).
  // decode(encode(s)) == s for every byte string s. Thread-safe (the chunk cache is per call).
  std::vector<uint32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<uint32_t>& out) const;
  // Every document's tokens, each followed by the end-of-text id when the tokenizer has one.
  std::vector<uint32_t> encode_documents(std::span<const std::string> documents) const;

  // Bytes of the tokens; the end-of-text id decodes to "<|endoftext|>". Throws ConfigError for
  // an id >= vocab_size().
  std::string decode(std::span<const uint32_t> tokens) const;
  // Bytes of one token.
  const std::string& token_bytes(uint32_t id) const;

  int vocab_size() const { return static_cast<int>(vocab_.size()); }
  std::optional<uint32_t> end_of_text() const { return end_of_text_; }
  const std::vector<Merge>& merges() const { return merges_; }

  // JSON text of the tokenizer (docs/DATA.md), and back. from_json throws IoError naming
  // `source` (a file name) when the text is not a valid tokenizer.
  std::string to_json() const;
  static BpeTokenizer from_json(std::string_view json_text, const std::string& source);
  // Writes / reads tokenizer.json. Throws IoError naming the path on failure.
  void save(const std::filesystem::path& path) const;
  static BpeTokenizer load(const std::filesystem::path& path);

  // Stable 64-bit fingerprint of the merges and special tokens (equal tokenizers, equal value).
  uint64_t fingerprint() const;

  bool operator==(const BpeTokenizer& other) const {
    return merges_ == other.merges_ && end_of_text_ == other.end_of_text_;
  }

 private:
  struct ChunkCache;
  void build_tables();
  void encode_cached(std::string_view text, std::vector<uint32_t>& out, ChunkCache& cache) const;
  void encode_chunk(std::string_view chunk, std::vector<uint32_t>& out) const;

  std::vector<Merge> merges_;
  std::optional<uint32_t> end_of_text_;
  std::vector<std::string> vocab_;               // bytes of every id
  std::unordered_map<uint64_t, uint32_t> rank_;  // (left << 32 | right) -> merge rank
};

}  // namespace tessera::data
