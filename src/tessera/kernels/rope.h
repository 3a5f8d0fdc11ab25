// Rotary position embeddings (Su et al. 2021) in Hugging Face's "half rotation" convention (Llama,
// Qwen2, Mistral): within each head of size d, element i < d/2 is paired with element i + d/2 and
// the pair is rotated by the angle p * inv_freq[i] of the token's position p:
//   x'[i]       = x[i] cos - x[i + d/2] sin
//   x'[i + d/2] = x[i + d/2] cos + x[i] sin,      inv_freq[i] = theta^(-2i/d).
// Positions are given per row, so a sequence split or permuted over ranks (context parallelism)
// rotates each token by its own global position.
#pragma once

#include <cstdint>

namespace tessera::kernels {

// Llama 3's frequency scaling (Hugging Face rope_type "llama3"): wavelengths 2 pi / inv_freq
// longer than original_max_positions / low_freq_factor are divided by `factor`, those shorter
// than original_max_positions / high_freq_factor are kept, and those in between are interpolated
// smoothly. factor <= 0: no scaling.
struct RopeScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_positions = 8192.0;
};

// ASSIGNS inv_freq[head_dim / 2] for base `theta` (head_dim even), scaled as `scaling` says.
// Computed in double and rounded once, so every rank holds the same table.
void rope_inverse_frequencies(float* inv_freq, int head_dim, double theta,
                              const RopeScaling& scaling = {});

// ASSIGNS cos[P, d/2] and sin[P, d/2] for positions 0..P-1 (angles p * inv_freq[i] in double;
// Hugging Face multiplies in fp32, whose angles at positions in the thousands are off by ~1e-3
// rad, so comparisons with it at long contexts need that tolerance).
void rope_tables(float* cos, float* sin, const float* inv_freq, int head_dim, int64_t positions);

// Rotates, IN PLACE, `heads` heads of size head_dim in each of `rows` rows of x (row r starts at
// x + r * ld; head h at column h * head_dim) by the angles of position pos[r], read from the
// tables. inverse: rotates by minus the angle, which is the backward (the rotation is orthogonal:
// dL/dx = R^T dL/dx').
void rope_apply(float* x, int64_t rows, int heads, int head_dim, int64_t ld, const int64_t* pos,
                const float* cos, const float* sin, bool inverse = false);

}  // namespace tessera::kernels
