#include "tessera/kernels/residual.h"

namespace tessera::kernels {

void residual_forward(float* out, const float* in1, const float* in2, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = in1[i] + in2[i];
}

void bias_residual_forward(float* out, const float* in, const float* bias, const float* residual,
                           int64_t M, int64_t N) {
  for (int64_t i = 0; i < M; ++i) {
    const float* x = in + i * N;
    const float* r = residual + i * N;
    float* o = out + i * N;
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) o[j] = r[j] + (x[j] + bias[j]);
  }
}

void bias_forward(float* out, const float* in, const float* bias, int64_t M, int64_t N) {
  for (int64_t i = 0; i < M; ++i) {
    const float* x = in + i * N;
    float* o = out + i * N;
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) o[j] = x[j] + bias[j];
  }
}

void residual_backward(float* din1, float* din2, const float* dout, int64_t n) {
  if (din1 != nullptr)
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) din1[i] += dout[i];
  if (din2 != nullptr)
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) din2[i] += dout[i];
}

}  // namespace tessera::kernels
