#include "tessera/kernels/residual.h"

#include "tessera/kernels/parallel_rows.h"

namespace tessera::kernels {

// Elementwise, spread over the rank's compute threads (parallel_rows): bitwise one thread's result.
void residual_forward(float* out, const float* in1, const float* in2, int64_t n) {
  parallel_rows(n, 1, [&](int64_t first, int64_t end) {
#pragma omp simd
    for (int64_t i = first; i < end; ++i) out[i] = in1[i] + in2[i];
  });
}

void bias_residual_forward(float* out, const float* in, const float* bias, const float* residual,
                           int64_t M, int64_t N) {
  parallel_rows(M, N, [&](int64_t first, int64_t end) {
    for (int64_t i = first; i < end; ++i) {
      const float* x = in + i * N;
      const float* r = residual + i * N;
      float* o = out + i * N;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) o[j] = r[j] + (x[j] + bias[j]);
    }
  });
}

void bias_forward(float* out, const float* in, const float* bias, int64_t M, int64_t N) {
  parallel_rows(M, N, [&](int64_t first, int64_t end) {
    for (int64_t i = first; i < end; ++i) {
      const float* x = in + i * N;
      float* o = out + i * N;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) o[j] = x[j] + bias[j];
    }
  });
}

void residual_backward(float* din1, float* din2, const float* dout, int64_t n) {
  parallel_rows(n, 1, [&](int64_t first, int64_t end) {
    if (din1 != nullptr)
#pragma omp simd
      for (int64_t i = first; i < end; ++i) din1[i] += dout[i];
    if (din2 != nullptr)
#pragma omp simd
      for (int64_t i = first; i < end; ++i) din2[i] += dout[i];
  });
}

}  // namespace tessera::kernels
