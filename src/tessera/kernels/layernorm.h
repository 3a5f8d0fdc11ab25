// LayerNorm over the last dimension (eps inside the square root, biased variance, as PyTorch).
#pragma once

namespace tessera::kernels {

// ASSIGNS out[N,C] = (in - mean) * rstd * weight + bias, and saves mean[N], rstd[N]
// (rstd = 1 / sqrt(var + eps)). out must not alias in.
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int N, int C, float eps);

// Given dout[N,C]: din[N,C] += d/d(in) (ACCUMULATES: din is usually the residual stream's
// gradient); dweight[C] += and dbias[C] += (ACCUMULATE). Uses the saved mean/rstd.
void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                        const float* in, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

}  // namespace tessera::kernels
