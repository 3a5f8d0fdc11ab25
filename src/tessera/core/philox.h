// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11). A random number is a pure
// function of (seed, stream, index), so any shard of a tensor can compute exactly the values one
// device would, in any order, on any rank.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tessera {

using PhiloxBlock = std::array<uint32_t, 4>;

// Ten rounds of Philox4x32 on `counter` with `key`.
PhiloxBlock philox4x32(PhiloxBlock counter, std::array<uint32_t, 2> key);

// FNV-1a 64-bit hash: stable across runs and platforms. Used to turn names into streams.
uint64_t stable_hash(std::string_view s);
// Mixes several integers into one stream id (order matters).
uint64_t mix_stream(uint64_t a, uint64_t b);

// Uniform in (0, 1], from counter (index, stream) and key seed.
float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal (Box-Muller on one Philox block).
float philox_normal(uint64_t seed, uint64_t stream, uint64_t index);

// Fills out[0..n) with normal(mean, std) for global indices [first_index, first_index + n).
void philox_fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t first_index,
                        float mean, float std);

}  // namespace tessera
