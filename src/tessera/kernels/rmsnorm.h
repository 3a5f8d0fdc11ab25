// RMSNorm over the last dimension (Llama, Qwen, Mistral): y = x / sqrt(mean(x^2) + eps) * weight,
// computed in fp32 with eps inside the square root, as Hugging Face's LlamaRMSNorm does.
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ASSIGNS out[N,C] = in * rstd * weight and saves rstd[N] = 1 / sqrt(mean(in^2) + eps). out must
// not alias in.
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t N,
                     int64_t C, float eps);

// Given dout[N,C]: din[N,C] += d/d(in) (ACCUMULATES, like layernorm_backward: din is usually the
// residual stream's gradient) and dweight[C] += (ACCUMULATES), from the saved rstd.
//   din = rstd * (dout * w - in * rstd^2 * mean(dout * w * in)).
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t N, int64_t C);

}  // namespace tessera::kernels
