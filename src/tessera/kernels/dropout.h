// Inverted dropout with layout-invariant masks (docs/ARCHITECTURE.md, decision 3). Element i is
// kept when philox_uniform(seed, stream, index_of(i)) > p and then scaled by 1 / (1 - p). The
// caller maps local elements to global coordinates, so any shard of a tensor (a row range of
// samples, a column range of features) draws exactly the numbers that one device draws for those
// elements. Conventional coordinates: stream = mix_stream(step, site id), and for a [B, T, C]
// activation whose rows are global samples [s0, s0 + B): index = ((sample * T) + t) * C + c. p == 0
// is an exact identity that never touches the RNG (so is eval mode: the caller skips it).
#pragma once

#include <cstdint>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/row_map.h"

namespace tessera::kernels {

// Checks 0 <= p < 1 and returns 1 / (1 - p).
float dropout_scale(float p);

// ASSIGNS out[n] = in[n] * keep[n] / (1 - p) and mask[n] = keep[n] (0 or 1; null: not saved).
// index_of(int64_t i) -> uint64_t gives the global RNG index of local element i.
// out may alias in.
template <typename IndexOf>
void dropout_forward(float* out, uint8_t* mask, const float* in, int64_t n, float p, uint64_t seed,
                     uint64_t stream, IndexOf&& index_of) {
  if (p == 0.0f) {
    if (out != in && n > 0) std::memcpy(out, in, sizeof(float) * static_cast<size_t>(n));
    if (mask != nullptr && n > 0) std::memset(mask, 1, static_cast<size_t>(n));
    return;
  }
  const float scale = dropout_scale(p);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = philox_uniform(seed, stream, static_cast<uint64_t>(index_of(i))) > p;
    out[i] = keep ? in[i] * scale : 0.0f;
    if (mask != nullptr) mask[i] = keep ? 1 : 0;
  }
}

// The conventional [B, T, C] case: local rows are global samples [first_sample, first_sample+B),
// local columns are global features [c_offset, c_offset + C) of c_global (-1: c_global = C).
// index = ((first_sample + b) * T + t) * c_global + c_offset + c.
void dropout_forward_btc(float* out, uint8_t* mask, const float* in, int B, int T, int C, float p,
                         uint64_t seed, uint64_t stream, int64_t first_sample, int64_t c_offset = 0,
                         int64_t c_global = -1);

// ASSIGNS mask[B, T, C] = the keep mask dropout_forward_btc draws for the same coordinates,
// without touching any data (activation recomputation rebuilds masks with it).
void dropout_mask_btc(uint8_t* mask, int B, int T, int C, float p, uint64_t seed, uint64_t stream,
                      int64_t first_sample, int64_t c_offset = 0, int64_t c_global = -1);

// Rows [first_row, first_row + rows) of the step's [samples * T, C] activation (a row is a global
// token, (sample * T + t); first_row = first_sample * T + the micro-batch row of the first one):
// the same numbers dropout_forward_btc draws for those tokens, index = (first_row + row) * C + c.
// A sequence-parallel rank draws its slice of the single-device mask with it.
void dropout_forward_rows(float* out, uint8_t* mask, const float* in, int64_t rows, int C, float p,
                          uint64_t seed, uint64_t stream, int64_t first_row);
void dropout_mask_rows(uint8_t* mask, int64_t rows, int C, float p, uint64_t seed, uint64_t stream,
                       int64_t first_row);
// The same for rows [first, first + rows) of a micro-batch whose rows `map` places in the global
// batch (kernels/row_map.h): index = map.global_row(first + row) * C + c. A context-parallel rank
// (its load-balanced positions), and a sequence-parallel slice of its rows, draws the
// single-device mask of its tokens; the whole-sequence map draws what the first_row forms draw.
void dropout_forward_rows(float* out, uint8_t* mask, const float* in, int64_t rows, int C, float p,
                          uint64_t seed, uint64_t stream, const RowMap& map, int64_t first);
void dropout_mask_rows(uint8_t* mask, int64_t rows, int C, float p, uint64_t seed, uint64_t stream,
                       const RowMap& map, int64_t first);

// ASSIGNS din[n] = dout[n] * mask[n] / (1 - p). din may alias dout. p == 0: copy.
void dropout_backward(float* din, const float* dout, const uint8_t* mask, int64_t n, float p);

}  // namespace tessera::kernels
