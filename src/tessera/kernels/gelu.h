// GELU, tanh approximation (GPT-2's "gelu_new"):
//   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ASSIGNS out[n] = gelu(in[n]). out may alias in.
void gelu_forward(float* out, const float* in, int64_t n);

// ASSIGNS din[n] = gelu'(in[n]) * dout[n]. din may alias dout (in-place backward).
void gelu_backward(float* din, const float* dout, const float* in, int64_t n);

}  // namespace tessera::kernels
