// fp32 <-> bf16 conversion kernels. bf16 is the top half of an fp32 (8 exponent bits, 8 significant
// bits): conversion rounds to nearest, ties to even (the rule of core/dtype.h's to_bf16); a NaN
// stays a NaN (quiet), infinities stay infinite, and finite values past the largest bf16 round to
// infinity. Subnormals are kept (not flushed).
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ASSIGNS out[n] = bf16 bits of in[n].
void f32_to_bf16(uint16_t* out, const float* in, int64_t n);

// ASSIGNS out[n] = the fp32 value of the bf16 bits in[n] (exact).
void bf16_to_f32(float* out, const uint16_t* in, int64_t n);

// ASSIGNS out[n] = in[n] rounded to the nearest bf16, as an fp32 (its low 16 bits zero).
// out may alias in.
void round_to_bf16(float* out, const float* in, int64_t n);

// The same on a row-major [rows, cols] matrix with leading dimension ld (>= cols) into a dense
// [rows, cols] out (leading dimension cols); large ones on the rank's compute threads
// (parallel_rows.h), bitwise the same.
void round_to_bf16_rows(float* out, const float* in, int64_t rows, int64_t cols, int64_t ld);
void f32_to_bf16_rows(uint16_t* out, const float* in, int64_t rows, int64_t cols, int64_t ld);
void bf16_to_f32_rows(float* out, const uint16_t* in, int64_t rows, int64_t cols, int64_t ld);

}  // namespace tessera::kernels
