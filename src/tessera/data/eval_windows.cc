#include "tessera/data/eval_windows.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera::data {

EvalWindows::EvalWindows(std::shared_ptr<const TokenSource> tokens, TokenRange range, int seq_len)
    : tokens_(std::move(tokens)), range_(range), seq_len_(seq_len) {
  TESSERA_CHECK_AS(ConfigError, tokens_ != nullptr, "the evaluation needs a token source");
  TESSERA_CHECK_AS(ConfigError, seq_len_ > 0, "the sequence length must be positive, not ",
                   seq_len_);
  TESSERA_CHECK_AS(ConfigError,
                   range_.begin >= 0 && range_.begin <= range_.end && range_.end <= tokens_->size(),
                   "the token range [", range_.begin, ", ", range_.end, ") is outside ",
                   tokens_->name(), ", which holds ", tokens_->size(), " tokens");
  windows_ = range_.size() > seq_len_ ? (range_.size() - 1) / seq_len_ : 0;
}

int64_t EvalWindows::num_batches(int batch_size) const {
  TESSERA_CHECK(batch_size > 0, "the batch size must be positive, not ", batch_size);
  return (windows_ + batch_size - 1) / batch_size;
}

void EvalWindows::fetch(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const {
  TESSERA_CHECK(first >= 0 && count >= 0 && first + count <= windows_, "evaluation windows [",
                first, ", ", first + count, ") do not exist; there are ", windows_);
  for (int64_t i = 0; i < count; ++i) {
    read_window(*tokens_, range_.begin + (first + i) * seq_len_, seq_len_, inputs + i * seq_len_,
                targets + i * seq_len_);
  }
}

int64_t EvalWindows::fetch_batch(int64_t b, int batch_size, int32_t* inputs,
                                 int32_t* targets) const {
  TESSERA_CHECK(b >= 0 && b < num_batches(batch_size), "evaluation batch ", b,
                " does not exist; there are ", num_batches(batch_size), " of ", batch_size);
  const int64_t first = b * batch_size;
  const int64_t count = std::min<int64_t>(batch_size, windows_ - first);
  fetch(first, count, inputs, targets);
  return count;
}

}  // namespace tessera::data
