// ByteLevelBpeModel: the BPE model of a Hugging Face tokenizer.json whose text arrives
// byte-level encoded (byte_level.h): the vocabulary held as the bytes each token stands for,
// the merges as ranked id pairs, and the encoding of one pre-tokenized piece exactly as
// Hugging Face's BPE does it (repeatedly merge the pair of lowest rank, the leftmost on a tie;
// with ignore_merges, a piece that is a whole vocabulary token is that token).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera::data {

class ByteLevelBpeModel {
 public:
  struct Options {
    bool ignore_merges = false;
    // The token of bytes the vocabulary lacks (Hugging Face's unk_token); without one every byte
    // must have its token.
    std::optional<std::string> unk_token;
    // Consecutive bytes without a token become one unk_token (Hugging Face's fuse_unk).
    bool fuse_unk = false;
  };

  // The largest id a vocabulary may use (ids index an embedding; a file asking for more is
  // malformed rather than a model).
  static constexpr uint32_t kMaxId = (1u << 24) - 1;

  ByteLevelBpeModel() = default;
  // `vocab`: (token as written in tokenizer.json, id); `merges`: pairs of tokens, in rank order.
  // Throws IoError naming `source` when a merge names a token the vocabulary lacks or makes one
  // it lacks, when two tokens share an id, when an id exceeds kMaxId, or when a byte has no token
  // and there is no unk_token.
  ByteLevelBpeModel(const std::vector<std::pair<std::string, uint32_t>>& vocab,
                    const std::vector<std::pair<std::string, std::string>>& merges,
                    const Options& options, const std::string& source);

  // Appends the ids of one piece (raw bytes, not byte-level characters).
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;

  // The bytes id stands for; std::nullopt when the id is not in the vocabulary.
  std::optional<std::string_view> token_bytes(uint32_t id) const;
  // The id of a token as tokenizer.json writes it.
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  // One more than the largest id.
  uint32_t id_limit() const { return id_limit_; }

 private:
  struct MergeTarget {
    uint32_t rank;
    uint32_t id;
  };
  static uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }

  // id -> the token's bytes (a map: a file's ids may have gaps, and a large id must not cost
  // memory)
  std::unordered_map<uint32_t, std::string> id_bytes_;
  uint32_t id_limit_ = 0;
  std::unordered_map<std::string, uint32_t> by_text_;   // token as written -> id
  std::unordered_map<std::string, uint32_t> by_bytes_;  // token bytes -> id (ignore_merges)
  std::array<int64_t, 256> byte_id_{};                  // id of each single byte, or -1
  std::unordered_map<uint64_t, MergeTarget> merges_;
  std::optional<uint32_t> unk_id_;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
};

}  // namespace tessera::data
