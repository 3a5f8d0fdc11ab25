// SwiGLU, the gated MLP activation of Llama, Qwen and Mistral (Shazeer 2020): h = silu(gate) * up
// with silu(g) = g * sigmoid(g), the gate and up projections' outputs side by side.
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ASSIGNS out[rows, cols] = silu(gate) * up, where row r of gate and of up starts at r * ld (so a
// fused [rows, 2 cols] projection passes its two halves with ld = 2 cols). out is contiguous.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t rows, int64_t cols,
                    int64_t ld);

// Given dout[rows, cols]: ASSIGNS dgate = dout * up * silu'(gate) and dup = dout * silu(gate), in
// the layout of gate and up (stride ld; they may be gate and up themselves, in place);
// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t rows, int64_t cols, int64_t ld);

}  // namespace tessera::kernels
