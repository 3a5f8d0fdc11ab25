// Deterministic training sampler. Each epoch visits every non-overlapping window of seq_len
// tokens of a token range once, in an order that depends only on (seed, epoch): a Fisher-Yates
// shuffle driven by Philox. Sequences are numbered globally (epoch e, index k) -> e * W + k, so
// global batch b of B sequences holds sequences b*B .. b*B+B-1 (a batch may span two epochs).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/data/dataset.h"
#include "tessera/data/token_source.h"

namespace tessera::data {

// Where the sampler is: the next sequence is number `index` of epoch `epoch`. Save it in a
// checkpoint and restore it to continue bitwise identically.
struct SamplerPosition {
  int64_t epoch = 0;
  int64_t index = 0;
  bool operator==(const SamplerPosition&) const = default;
};

struct SamplerOptions {
  int seq_len = 256;
  uint64_t seed = 0;
  // Shift every window of an epoch by the same offset drawn from [0, slack], where slack =
  // (range size - 1) mod seq_len is the room the windows leave, so the token/position pairing
  // changes between epochs while the window count stays fixed. false: offset 0.
  bool random_offset = true;
};

// Not thread-safe (it caches the current epoch's permutation): one sampler per rank/thread.
class WindowSampler {
 public:
  // Throws ConfigError when `range` is outside `tokens` or holds fewer than seq_len + 1 tokens.
  WindowSampler(std::shared_ptr<const TokenSource> tokens, TokenRange range,
                const SamplerOptions& options);

  int seq_len() const { return options_.seq_len; }
  // W: windows per epoch, floor((range size - 1) / seq_len), the same for every epoch.
  int64_t windows_per_epoch() const { return windows_; }
  // Offset of epoch e's windows from range.begin, in [0, slack].
  int64_t epoch_offset(int64_t epoch) const;
  // Token position where sequence k of epoch e starts.
  int64_t window_start(int64_t epoch, int64_t k);

  SamplerPosition position() const { return pos_; }
  // Throws ConfigError when the position is negative or index >= windows_per_epoch().
  void set_position(SamplerPosition p);
  // The position n sequences after p.
  SamplerPosition advance(SamplerPosition p, int64_t n) const;

  // Rows [row_begin, row_end) of the global batch of batch_size sequences that starts at the
  // current position, into inputs/targets [row_end - row_begin, seq_len] (row-major int32);
  // then advances the position by batch_size. Data-parallel rank r of dp passes rows
  // [r*B/dp, (r+1)*B/dp): every rank advances identically and sees exactly the rows one device
  // would.
  void next_batch(int batch_size, int row_begin, int row_end, int32_t* inputs, int32_t* targets);
  // The same rows of the batch starting at position p, without moving.
  void fetch(SamplerPosition p, int batch_size, int row_begin, int row_end, int32_t* inputs,
             int32_t* targets);

 private:
  const std::vector<uint32_t>& permutation(int64_t epoch);

  std::shared_ptr<const TokenSource> tokens_;
  TokenRange range_;
  SamplerOptions options_;
  int64_t windows_ = 0;
  int64_t slack_ = 0;
  SamplerPosition pos_;
  int64_t cached_epoch_ = -1;
  std::vector<uint32_t> perm_;  // permutation of the cached epoch (4 bytes per window)
};

}  // namespace tessera::data
