#include "tessera/kernels/gelu.h"

#include "tessera/kernels/parallel_rows.h"
#include "tessera/kernels/vec_math.h"

namespace tessera::kernels {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

// Elementwise, spread over the rank's compute threads (parallel_rows): bitwise one thread's result.
void gelu_forward(float* out, const float* in, int64_t n) {
  parallel_rows(n, 1, [&](int64_t first, int64_t end) {
#pragma omp simd
    for (int64_t i = first; i < end; ++i) {
      const float x = in[i];
      const float t = detail::tanh_f(kSqrt2OverPi * (x + kCubic * x * x * x));
      out[i] = 0.5f * x * (1.0f + t);
    }
  });
}

void gelu_backward(float* din, const float* dout, const float* in, int64_t n) {
  parallel_rows(n, 1, [&](int64_t first, int64_t end) {
#pragma omp simd
    for (int64_t i = first; i < end; ++i) {
      const float x = in[i];
      const float t = detail::tanh_f(kSqrt2OverPi * (x + kCubic * x * x * x));
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
      din[i] = (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * dout[i];
    }
  });
}

}  // namespace tessera::kernels
