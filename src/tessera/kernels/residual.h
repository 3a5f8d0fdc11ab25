// Residual connection x + f(x). In the model the common case (no dropout) is fused into the
// projection GEMM (matmul_forward's `residual` argument); these are the stand-alone forms.
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ASSIGNS out[n] = in1[n] + in2[n]. out may alias either input.
void residual_forward(float* out, const float* in1, const float* in2, int64_t n);

// ACCUMULATES din1[n] += dout[n] and din2[n] += dout[n] (either may be null).
void residual_backward(float* din1, float* din2, const float* dout, int64_t n);

}  // namespace tessera::kernels
