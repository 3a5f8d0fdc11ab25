#include "tessera/core/philox.h"

#include <cmath>

namespace tessera {

PhiloxBlock philox4x32(PhiloxBlock c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

uint64_t stable_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t mix_stream(uint64_t a, uint64_t b) {
  // splitmix64 finaliser over a combination; not symmetric in a and b.
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {
PhiloxBlock block_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                     static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}
// (0, 1]: never 0, so log() is finite.
inline float to_unit(uint32_t x) {
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}
inline double to_unit_d(uint32_t a, uint32_t b) {
  uint64_t x = (static_cast<uint64_t>(a) << 21) ^ b;  // 53 bits
  x &= (1ull << 53) - 1;
  return (static_cast<double>(x) + 1.0) * (1.0 / 9007199254740992.0);
}
}  // namespace

float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return to_unit(block_at(seed, stream, index)[0]);
}

float philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  PhiloxBlock b = block_at(seed, stream, index);
  double u1 = to_unit_d(b[0], b[1]);
  double u2 = to_unit_d(b[2], b[3]);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void philox_fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t first_index,
                        float mean, float std) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = mean + std * philox_normal(seed, stream, first_index + static_cast<uint64_t>(i));
}

}  // namespace tessera
