#include "tessera/data/sampler.h"

#include <limits>
#include <numeric>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"

namespace tessera::data {
namespace {

// 64 random bits from Philox at (seed, stream, index).
uint64_t random64(uint64_t seed, uint64_t stream, uint64_t index) {
  const PhiloxBlock b =
      philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                  static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return (static_cast<uint64_t>(b[0]) << 32) | b[1];
}

// Uniform integer in [0, n) (n > 0): Lemire's multiply-shift on 64 random bits; the bias is
// below n / 2^64, negligible for any window count.
uint64_t uniform_below(uint64_t r, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
}

uint64_t shuffle_stream(int64_t epoch) {
  return mix_stream(stable_hash("tessera.data.sampler.shuffle"), static_cast<uint64_t>(epoch));
}
uint64_t offset_stream(int64_t epoch) {
  return mix_stream(stable_hash("tessera.data.sampler.offset"), static_cast<uint64_t>(epoch));
}

}  // namespace

WindowSampler::WindowSampler(std::shared_ptr<const TokenSource> tokens, TokenRange range,
                             const SamplerOptions& options)
    : tokens_(std::move(tokens)), range_(range), options_(options) {
  TESSERA_CHECK_AS(ConfigError, tokens_ != nullptr, "the sampler needs a token source");
  TESSERA_CHECK_AS(ConfigError, options_.seq_len > 0, "the sequence length must be positive, not ",
                   options_.seq_len);
  TESSERA_CHECK_AS(ConfigError,
                   range_.begin >= 0 && range_.begin <= range_.end && range_.end <= tokens_->size(),
                   "the token range [", range_.begin, ", ", range_.end, ") is outside ",
                   tokens_->name(), ", which holds ", tokens_->size(), " tokens");
  TESSERA_CHECK_AS(ConfigError, range_.size() >= options_.seq_len + 1, "the training data (",
                   tokens_->name(), ", tokens [", range_.begin, ", ", range_.end, ")) holds ",
                   range_.size(), " tokens, fewer than one window of sequence length ",
                   options_.seq_len, " + 1; use more data or a shorter sequence length");
  windows_ = (range_.size() - 1) / options_.seq_len;
  slack_ = (range_.size() - 1) % options_.seq_len;
  TESSERA_CHECK_AS(ConfigError, windows_ <= std::numeric_limits<uint32_t>::max(),
                   "the training data has ", windows_,
                   " windows per epoch; at most 2^32-1 are supported; use a longer sequence");
}

int64_t WindowSampler::epoch_offset(int64_t epoch) const {
  if (!options_.random_offset || slack_ == 0) return 0;
  return static_cast<int64_t>(uniform_below(random64(options_.seed, offset_stream(epoch), 0),
                                            static_cast<uint64_t>(slack_) + 1));
}

const std::vector<uint32_t>& WindowSampler::permutation(int64_t epoch) {
  if (epoch == cached_epoch_) return perm_;
  perm_.resize(static_cast<std::size_t>(windows_));
  std::iota(perm_.begin(), perm_.end(), 0u);
  const uint64_t stream = shuffle_stream(epoch);
  for (int64_t i = windows_ - 1; i > 0; --i) {
    const uint64_t j = uniform_below(random64(options_.seed, stream, static_cast<uint64_t>(i)),
                                     static_cast<uint64_t>(i) + 1);
    std::swap(perm_[static_cast<std::size_t>(i)], perm_[j]);
  }
  cached_epoch_ = epoch;
  return perm_;
}

int64_t WindowSampler::window_start(int64_t epoch, int64_t k) {
  TESSERA_CHECK(epoch >= 0 && k >= 0 && k < windows_, "sequence ", k, " of epoch ", epoch,
                " does not exist; an epoch has ", windows_, " sequences");
  const int64_t w = permutation(epoch)[static_cast<std::size_t>(k)];
  return range_.begin + epoch_offset(epoch) + w * options_.seq_len;
}

void WindowSampler::set_position(SamplerPosition p) {
  TESSERA_CHECK_AS(ConfigError, p.epoch >= 0 && p.index >= 0 && p.index < windows_,
                   "the sampler position (epoch ", p.epoch, ", index ", p.index,
                   ") is invalid for this data: an epoch has ", windows_,
                   " sequences; was the checkpoint made with other data or another sequence "
                   "length?");
  pos_ = p;
}

SamplerPosition WindowSampler::advance(SamplerPosition p, int64_t n) const {
  const int64_t s = p.index + n;
  return {p.epoch + s / windows_, s % windows_};
}

void WindowSampler::fetch(SamplerPosition p, int batch_size, int row_begin, int row_end,
                          int32_t* inputs, int32_t* targets) {
  TESSERA_CHECK(batch_size > 0 && 0 <= row_begin && row_begin <= row_end && row_end <= batch_size,
                "rows [", row_begin, ", ", row_end, ") are not a range of a batch of ", batch_size,
                " sequences");
  const int64_t T = options_.seq_len;
  for (int r = row_begin; r < row_end; ++r) {
    const SamplerPosition q = advance(p, r);
    const int64_t off = static_cast<int64_t>(r - row_begin) * T;
    read_window(*tokens_, window_start(q.epoch, q.index), options_.seq_len, inputs + off,
                targets + off);
  }
}

void WindowSampler::next_batch(int batch_size, int row_begin, int row_end, int32_t* inputs,
                               int32_t* targets) {
  fetch(pos_, batch_size, row_begin, row_end, inputs, targets);
  pos_ = advance(pos_, batch_size);
}

}  // namespace tessera::data
