// Token + learned position embedding (GPT-2's input layer).
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ASSIGNS out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :].
// tokens[B,T] must already be validated to lie in [0, V) (the model checks and names bad ids).
// wte[V,C], wpe[>=T,C].
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C);

// ACCUMULATES dwte[V,C] += scatter of dout[B,T,C] by token; dwpe[T,C] += sum over b of dout.
// Either gradient may be null (skipped). Serial in a fixed order: deterministic.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

}  // namespace tessera::kernels
