// Token + learned position embedding (GPT-2's input layer).
#pragma once

#include <cstdint>

#include "tessera/kernels/row_map.h"

namespace tessera::kernels {

// ASSIGNS out[B,T,C] = wte[tokens[b,t], :] + wpe[pos(t), :], pos(t) = positions[t] (the global
// positions of a context-parallel rank's rows) or t (positions null).
// tokens[B,T] must already be validated to lie in [0, V) (the model checks and names bad ids).
// wte[V,C], wpe[> every pos(t), C].
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C, const int64_t* positions = nullptr);

// ACCUMULATES dwte[V,C] += scatter of dout[B,T,C] by token; dwpe[pos(t)] += sum over b of dout.
// Either gradient may be null (skipped). Serial in a fixed order: deterministic.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C, const int64_t* positions = nullptr);

}  // namespace tessera::kernels

// ---- Vocabulary-parallel embedding: a rank holds rows [row_begin, row_begin + rows) of wte ----
namespace tessera::kernels {

// ASSIGNS out[N, C] = wte_local[tokens[n] - row_begin] for tokens in the rank's rows, 0 otherwise.
void embedding_lookup_rows(float* out, const int32_t* tokens, const float* wte_local,
                           int64_t row_begin, int64_t rows, int64_t N, int C);
// out[B, T, C] += wpe[pos(t), :] (pos as for embedding_forward).
void add_positions(float* out, const float* wpe, int B, int T, int C,
                   const int64_t* positions = nullptr);
// Rows [first_row, first_row + rows) of a [B, T, C] activation (row b * T + t) in out[rows, C]:
// out[i] += wpe[(first_row + i) % T] (a sequence-parallel slice).
void add_positions_rows(float* out, const float* wpe, int64_t first_row, int64_t rows, int T,
                        int C);
// Rows [first, first + rows) of a micro-batch placed by `map` (kernels/row_map.h) in out[rows, C]:
// out[i] += wpe[map.position((first + i) % map.T)] (a sequence-parallel slice of a
// context-parallel rank's rows).
void add_positions_rows(float* out, const float* wpe, const RowMap& map, int64_t first,
                        int64_t rows, int C);
// ACCUMULATES dwte_local[tokens[n] - row_begin] += dout[n] for tokens in the rank's rows and
// dwpe[pos(t)] += sum over b of dout[b, t] (either may be null; pos as for embedding_forward).
// Serial: deterministic.
void embedding_rows_backward(float* dwte_local, float* dwpe, const float* dout,
                             const int32_t* tokens, int64_t row_begin, int64_t rows, int B, int T,
                             int C, const int64_t* positions = nullptr);

}  // namespace tessera::kernels
