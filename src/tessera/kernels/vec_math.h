// Branch-free float math that the compiler vectorises inside loops (internal to the kernels).
// std::exp is a library call that GCC does not vectorise without -ffast-math; these are.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace tessera::kernels::detail {

// e^x with a relative error below 2 ulp on [-87, 88]: x = n ln2 + r, |r| <= ln2/2, e^r from a
// degree-6 minimax polynomial (Cephes coefficients), 2^n assembled in the exponent bits.
// Inputs are clamped to [-87, 88], so the result is finite and positive.
inline float exp_f(float x) {
  // The clamp as two selects on x, not std::min/std::max: GCC (12, -fno-trapping-math) turned
  // max(x, -87) into a select whose arm it folded to a constant and carried through the caller,
  // so that SwiGLU computed g * 1/(1 + e^88), a product with a subnormal constant, on every lane
  // before masking it away: a microcode assist per vector, 7x slower (docs/PERFORMANCE.md,
  // "Subnormal constants"). Same values for every x, NaN included.
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.0f ? -87.0f : x;
  // n = round(x / ln2) without a float->int conversion (which GCC will not vectorise under the
  // default -ftrapping-math): adding 1.5 * 2^23 leaves n in the low mantissa bits.
  constexpr float kShifter = 12582912.0f;
  const float t = x * 1.44269504088896341f + kShifter;
  const float n = t - kShifter;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShifter);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);
}

// tanh(u) = 1 - 2 / (e^{2u} + 1): exact limits +-1, absolute error ~1e-7.
inline float tanh_f(float u) {
  return 1.0f - 2.0f / (exp_f(2.0f * u) + 1.0f);
}

}  // namespace tessera::kernels::detail
