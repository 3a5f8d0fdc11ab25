// IEEE 754 binary16 (F16) <-> float. bf16 lives in core/dtype.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tessera::io {

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    std::memcpy(&bits, &mag, 4);
    bits |= sign;
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN (payload kept)
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Rounds to nearest, ties to even; overflows to infinity; NaN stays NaN.
inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (u < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded to nearest even.
    float mag;
    std::memcpy(&mag, &u, 4);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(mag * 16777216.0f)));
  }
  uint32_t h = (((u >> 23) - 112u) << 10) | ((u >> 13) & 0x3ffu);
  const uint32_t rest = u & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
  return static_cast<uint16_t>(sign | h);
}

}  // namespace tessera::io
