// TokenSource: random access to a sequence of token ids, whatever holds them (a token file, a
// raw nanoGPT .bin, or memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Number of tokens.
  virtual int64_t size() const = 0;
  // Token i (0 <= i < size()).
  virtual uint32_t get(int64_t i) const = 0;
  // Copies tokens [first, first + n) to out[0..n). Throws tessera::Error when the range is
  // outside [0, size()).
  virtual void read(int64_t first, int64_t n, int32_t* out) const = 0;
  // Where the tokens come from, for messages: a file path or a short description.
  virtual std::string name() const = 0;
  // Largest id present (scans the tokens once; 0 for an empty source).
  virtual uint32_t max_id() const;
};

// Tokens held in memory.
class TokenVector final : public TokenSource {
 public:
  explicit TokenVector(std::vector<uint32_t> tokens, std::string name = "<tokens in memory>")
      : tokens_(std::move(tokens)), name_(std::move(name)) {}
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  uint32_t get(int64_t i) const override { return tokens_[static_cast<std::size_t>(i)]; }
  void read(int64_t first, int64_t n, int32_t* out) const override;
  std::string name() const override { return name_; }
  const std::vector<uint32_t>& tokens() const { return tokens_; }

 private:
  std::vector<uint32_t> tokens_;
  std::string name_;
};

// Throws ConfigError when some token id is >= vocab_size, naming the source, the first offending
// position and id, and the accepted range.
void check_token_ids(const TokenSource& source, int64_t vocab_size);

// Throws tessera::Error unless 0 <= first, 0 <= n and first + n <= source.size().
void check_token_range(const TokenSource& source, int64_t first, int64_t n);

// Entropy of the unigram distribution of the tokens in [begin, end) (end < 0: to the end), in
// nats per token: the loss of a model that predicts every token with its corpus frequency, the
// baseline a trained model's validation loss must beat. 0 for an empty range.
double unigram_entropy(const TokenSource& source, int64_t begin = 0, int64_t end = -1);

}  // namespace tessera::data
