// The added tokens of a Hugging Face tokenizer.json ("<|endoftext|>", "<|begin_of_text|>",
// "<|im_start|>", ...): found in the text before pre-tokenization, as Hugging Face does, so they
// are never split and a regex never sees them. Matching is leftmost-longest, first for the tokens
// marked "normalized": false, then, in the text between those, for the others (the two passes
// Hugging Face makes; without a normalizer they differ only where two tokens overlap).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessera::data {

struct AddedToken {
  uint32_t id = 0;
  std::string content;  // the text matched, and what the id decodes to
  bool special = false;
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Throws ConfigError for an empty content, or two tokens with the same content or id.
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  // Cuts `text` at the added tokens: fn(segment, id) for each piece in order, with the token's
  // id for a match and std::nullopt for the (non-empty) text between matches.
  void split(std::string_view text,
             const std::function<void(std::string_view, std::optional<uint32_t>)>& fn) const;

  // The token with this id or content, or nullptr.
  const AddedToken* find(uint32_t id) const;
  const AddedToken* find(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Tokens of one pass, by first byte, longest first.
  struct Pass {
    std::vector<std::vector<uint32_t>> by_first_byte;  // indices into tokens_
    bool empty = true;
  };
  // Start and index of the leftmost-longest match in text[from, ...), or npos.
  std::pair<std::size_t, uint32_t> next_match(const Pass& pass, std::string_view text,
                                              std::size_t from) const;
  void split_pass(std::size_t pass, std::string_view text,
                  const std::function<void(std::string_view, std::optional<uint32_t>)>& fn) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<uint32_t, std::size_t> by_id_;
  std::unordered_map<std::string, std::size_t> by_content_;
  Pass passes_[2];  // [0]: "normalized": false; [1]: "normalized": true
};

}  // namespace tessera::data
