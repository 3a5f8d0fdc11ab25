// crc32_update is the CRC-32 of zlib, gzip and PNG (reflected polynomial 0xEDB88320, initial and
// final inversion): checkpoints written before and after a change of implementation must agree.
#include "tessera/io/checksum.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tessera::io {
namespace {

// The definition, one bit at a time.
uint32_t crc32_bitwise(uint32_t crc, const unsigned char* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(g());
  return v;
}

TEST(Checksum, IsTheCrc32OfZlibAndGzip) {
  // The catalogued check value of CRC-32/ISO-HDLC (zlib's crc32) for "123456789".
  EXPECT_EQ(crc32_update(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32_update(0, "", 0), 0u);
  EXPECT_EQ(crc32_update(0x12345678u, "", 0), 0x12345678u);
}

TEST(Checksum, EqualsTheBitwiseDefinitionAtEveryLengthAndAlignment) {
  const auto data = random_bytes(4096 + 64, 7);
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t n : {0, 1, 3, 7, 15, 16, 31, 63, 64, 65, 127, 255, 256, 1000, 4096}) {
      ASSERT_EQ(crc32_update(0, data.data() + offset, n), crc32_bitwise(0, data.data() + offset, n))
          << "offset " << offset << ", " << n << " bytes";
    }
  }
}

TEST(Checksum, ContinuesOverPiecesAsOverTheWhole) {
  const auto data = random_bytes(size_t{3} << 20, 11);  // larger than any folding block
  const uint32_t whole = crc32_update(0, data.data(), data.size());
  EXPECT_EQ(whole, crc32_bitwise(0, data.data(), data.size()));
  std::mt19937 g(5);
  for (int trial = 0; trial < 20; ++trial) {
    uint32_t crc = 0;
    size_t at = 0;
    while (at < data.size()) {
      const size_t n = std::min<size_t>(data.size() - at, g() % 300000);
      crc = crc32_update(crc, data.data() + at, n);
      at += n;
    }
    ASSERT_EQ(crc, whole) << "trial " << trial;
  }
}

}  // namespace
}  // namespace tessera::io
