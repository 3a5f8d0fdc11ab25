#include "tessera/kernels/residual.h"

namespace tessera::kernels {

void residual_forward(float* out, const float* in1, const float* in2, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = in1[i] + in2[i];
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
