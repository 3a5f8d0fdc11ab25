#include "tessera/core/philox.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessera {
namespace {

// Known-answer tests from the Random123 distribution's kat_vectors for philox4x32_10.
TEST(Philox, KnownAnswers) {
  PhiloxBlock z = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(z, (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  PhiloxBlock f =
      philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(f, (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, NormalMomentsAndIndependenceOfOrder) {
  const int n = 200000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    double x = philox_normal(42, 7, i);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
  // A shard computes exactly what the whole would at the same global indices.
  std::vector<float> whole(100), shard(40);
  philox_fill_normal(whole.data(), 100, 1, 2, 0, 0.0f, 0.02f);
  philox_fill_normal(shard.data(), 40, 1, 2, 30, 0.0f, 0.02f);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(shard[i], whole[30 + i]);
  EXPECT_NE(philox_normal(1, 2, 0), philox_normal(1, 3, 0));
}

TEST(Philox, UniformIsInUnitInterval) {
  for (int i = 0; i < 10000; ++i) {
    float u = philox_uniform(9, 9, i);
    EXPECT_GT(u, 0.0f);
    EXPECT_LE(u, 1.0f);
  }
}

}  // namespace
}  // namespace tessera
