#include "tessera/kernels/dropout.h"

namespace tessera::kernels {

float dropout_scale(float p) {
  TESSERA_CHECK_AS(ConfigError, p >= 0.0f && p < 1.0f, "dropout probability ", p,
                   " is outside [0, 1)");
  return 1.0f / (1.0f - p);
}

namespace {
// The global RNG index of local element i of a [B, T, C] activation (see dropout.h).
struct BtcIndex {
  int T, C;
  int64_t first_sample, c_offset, c_global;
  uint64_t operator()(int64_t i) const {
    const int64_t c = i % C;
    const int64_t row = i / C;  // b * T + t
    const int64_t t = row % T;
    const int64_t b = row / T;
    return static_cast<uint64_t>(((first_sample + b) * T + t) * c_global + c_offset + c);
  }
};
}  // namespace

void dropout_forward_btc(float* out, uint8_t* mask, const float* in, int B, int T, int C, float p,
                         uint64_t seed, uint64_t stream, int64_t first_sample, int64_t c_offset,
                         int64_t c_global) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  dropout_forward(out, mask, in, n, p, seed, stream,
                  BtcIndex{T, C, first_sample, c_offset, c_global < 0 ? C : c_global});
}

void dropout_mask_btc(uint8_t* mask, int B, int T, int C, float p, uint64_t seed, uint64_t stream,
                      int64_t first_sample, int64_t c_offset, int64_t c_global) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  if (p == 0.0f) {
    if (n > 0) std::memset(mask, 1, static_cast<size_t>(n));
    return;
  }
  const BtcIndex index{T, C, first_sample, c_offset, c_global < 0 ? C : c_global};
  for (int64_t i = 0; i < n; ++i) mask[i] = philox_uniform(seed, stream, index(i)) > p ? 1 : 0;
}

void dropout_forward_rows(float* out, uint8_t* mask, const float* in, int64_t rows, int C, float p,
                          uint64_t seed, uint64_t stream, int64_t first_row) {
  const uint64_t base = static_cast<uint64_t>(first_row) * static_cast<uint64_t>(C);
  dropout_forward(out, mask, in, rows * C, p, seed, stream,
                  [base](int64_t i) { return base + static_cast<uint64_t>(i); });
}

void dropout_mask_rows(uint8_t* mask, int64_t rows, int C, float p, uint64_t seed, uint64_t stream,
                       int64_t first_row) {
  const int64_t n = rows * C;
  if (p == 0.0f) {
    if (n > 0) std::memset(mask, 1, static_cast<size_t>(n));
    return;
  }
  const uint64_t base = static_cast<uint64_t>(first_row) * static_cast<uint64_t>(C);
  for (int64_t i = 0; i < n; ++i)
    mask[i] = philox_uniform(seed, stream, base + static_cast<uint64_t>(i)) > p ? 1 : 0;
}

namespace {
// The global RNG index of element i of rows [first, ...) of a mapped [B, T, C] activation.
struct MappedRowIndex {
  const RowMap& map;
  int64_t first;
  int C;
  uint64_t operator()(int64_t i) const {
    const int64_t row = i / C;
    return static_cast<uint64_t>(map.global_row(first + row) * C + (i - row * C));
  }
};
}  // namespace

void dropout_forward_rows(float* out, uint8_t* mask, const float* in, int64_t rows, int C, float p,
                          uint64_t seed, uint64_t stream, const RowMap& map, int64_t first) {
  if (map.positions == nullptr && map.length() == map.T) {  // contiguous global rows
    dropout_forward_rows(out, mask, in, rows, C, p, seed, stream, map.first_sample * map.T + first);
    return;
  }
  dropout_forward(out, mask, in, rows * C, p, seed, stream, MappedRowIndex{map, first, C});
}

void dropout_mask_rows(uint8_t* mask, int64_t rows, int C, float p, uint64_t seed, uint64_t stream,
                       const RowMap& map, int64_t first) {
  if (map.positions == nullptr && map.length() == map.T) {
    dropout_mask_rows(mask, rows, C, p, seed, stream, map.first_sample * map.T + first);
    return;
  }
  const int64_t n = rows * C;
  if (p == 0.0f) {
    if (n > 0) std::memset(mask, 1, static_cast<size_t>(n));
    return;
  }
  const MappedRowIndex index{map, first, C};
  for (int64_t i = 0; i < n; ++i) mask[i] = philox_uniform(seed, stream, index(i)) > p ? 1 : 0;
}

void dropout_backward(float* din, const float* dout, const uint8_t* mask, int64_t n, float p) {
  if (p == 0.0f) {
    if (din != dout && n > 0) std::memcpy(din, dout, sizeof(float) * static_cast<size_t>(n));
    return;
  }
  const float scale = dropout_scale(p);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) din[i] = mask[i] ? dout[i] * scale : 0.0f;
}

}  // namespace tessera::kernels
