// Residual connection x + f(x) and the bias of a projection whose output is reduced first.
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ASSIGNS out[n] = in1[n] + in2[n]. out may alias either input.
void residual_forward(float* out, const float* in1, const float* in2, int64_t n);

// ASSIGNS out[M,N] = residual[M,N] + (in[M,N] + bias[N]): the bias of a row-parallel projection
// and the residual, added once after the tensor-parallel reduction. out may alias in or residual.
void bias_residual_forward(float* out, const float* in, const float* bias, const float* residual,
                           int64_t M, int64_t N);

// ASSIGNS out[M,N] = in[M,N] + bias[N] (out may alias in).
void bias_forward(float* out, const float* in, const float* bias, int64_t M, int64_t N);

// ACCUMULATES din1[n] += dout[n] and din2[n] += dout[n] (either may be null).
void residual_backward(float* din1, float* din2, const float* dout, int64_t n);

}  // namespace tessera::kernels
