// Evaluation windows for `tessera eval`: consecutive non-overlapping windows of a token range,
// window i with inputs [i*T, (i+1)*T) and targets [i*T+1, (i+1)*T+1) (relative to range.begin);
// a last partial window is dropped. Stateless and const: safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>

#include "tessera/data/dataset.h"
#include "tessera/data/token_source.h"

namespace tessera::data {

class EvalWindows {
 public:
  // Throws ConfigError when the range is outside `tokens` or seq_len is not positive. A range
  // shorter than seq_len + 1 has no windows.
  EvalWindows(std::shared_ptr<const TokenSource> tokens, TokenRange range, int seq_len);

  int seq_len() const { return seq_len_; }
  // floor((range size - 1) / seq_len).
  int64_t num_windows() const { return windows_; }
  // ceil(num_windows() / batch_size).
  int64_t num_batches(int batch_size) const;
  // Windows [first, first + count) into inputs/targets [count, seq_len] (row-major int32).
  void fetch(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const;
  // Batch b: windows [b*B, min((b+1)*B, num_windows())). Returns the rows written (the last
  // batch may be short).
  int64_t fetch_batch(int64_t b, int batch_size, int32_t* inputs, int32_t* targets) const;

 private:
  std::shared_ptr<const TokenSource> tokens_;
  TokenRange range_;
  int seq_len_;
  int64_t windows_ = 0;
};

}  // namespace tessera::data
