#include "tessera/kernels/bf16.h"

#include <cstring>

#include "tessera/kernels/parallel_rows.h"

namespace tessera::kernels {
namespace {

// Round-to-nearest-even on the bit pattern (branch-free, so the loops vectorise): add 0x7fff plus
// the lowest kept bit, truncate. A NaN keeps its top bits with the quiet bit set, so no NaN
// payload can round into an infinity.
inline uint32_t rounded_bits(uint32_t u) {
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return nan ? ((u | 0x00400000u) & 0xffff0000u) : rne;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void f32_to_bf16(uint16_t* out, const float* in, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<uint16_t>(rounded_bits(bits_of(in[i])) >> 16);
}

void bf16_to_f32(float* out, const uint16_t* in, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = float_of(static_cast<uint32_t>(in[i]) << 16);
}

void round_to_bf16(float* out, const float* in, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = float_of(rounded_bits(bits_of(in[i])));
}

void round_to_bf16_rows(float* out, const float* in, int64_t rows, int64_t cols, int64_t ld) {
  parallel_rows(rows, cols, [=](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) round_to_bf16(out + r * cols, in + r * ld, cols);
  });
}

void f32_to_bf16_rows(uint16_t* out, const float* in, int64_t rows, int64_t cols, int64_t ld) {
  parallel_rows(rows, cols, [=](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) f32_to_bf16(out + r * cols, in + r * ld, cols);
  });
}

void bf16_to_f32_rows(float* out, const uint16_t* in, int64_t rows, int64_t cols, int64_t ld) {
  parallel_rows(rows, cols, [=](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) bf16_to_f32(out + r * cols, in + r * ld, cols);
  });
}

}  // namespace tessera::kernels
