#include "tessera/kernels/dropout.h"

namespace tessera::kernels {

float dropout_scale(float p) {
  TESSERA_CHECK_AS(ConfigError, p >= 0.0f && p < 1.0f, "dropout probability ", p,
                   " is outside [0, 1)");
  return 1.0f / (1.0f - p);
}

void dropout_forward_btc(float* out, uint8_t* mask, const float* in, int B, int T, int C, float p,
                         uint64_t seed, uint64_t stream, int64_t first_sample, int64_t c_offset,
                         int64_t c_global) {
  if (c_global < 0) c_global = C;
  const int64_t n = static_cast<int64_t>(B) * T * C;
  dropout_forward(out, mask, in, n, p, seed, stream, [&](int64_t i) {
    const int64_t c = i % C;
    const int64_t row = i / C;  // b * T + t
    const int64_t t = row % T;
    const int64_t b = row / T;
    return static_cast<uint64_t>(((first_sample + b) * T + t) * c_global + c_offset + c);
  });
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
