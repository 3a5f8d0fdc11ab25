// Philox4x32-10 on the device: bitwise the numbers of core/philox.h (the same counter and key
// layout, the same ten rounds with the key bumped after each, the same float conversion), so a
// GPU dropout mask is the CPU's mask of the same coordinates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::cuda {

// Ten rounds of Philox4x32 on counter (x, y, z, w) with key (x, y), as tessera::philox4x32.
__device__ __forceinline__ uint4 philox4x32(uint4 c, uint2 k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c.x), lo0 = kM0 * c.x;
    const uint32_t hi1 = __umulhi(kM1, c.z), lo1 = kM1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += kW0;
    k.y += kW1;
  }
  return c;
}

// Uniform in (0, 1] from counter (index, stream) and key seed: tessera::philox_uniform.
__device__ __forceinline__ float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint4 counter =
      make_uint4(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                 static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32));
  const uint2 key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint32_t x = philox4x32(counter, key).x;
  // (x >> 8) + 1 is an integer in [1, 2^24]: exact in fp32, as is the product by 2^-24.
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

}  // namespace tessera::cuda
