#include "tessera/train/generate.h"

#include <gtest/gtest.h>

#include <map>

namespace tessera::train {
namespace {

TEST(SampleLogits, TopKAndTemperature) {
  std::vector<float> logits = {0.0f, 5.0f, 1.0f, 4.9f, -3.0f};
  // top-1 is greedy whatever the draw.
  for (float u : {0.01f, 0.5f, 1.0f}) EXPECT_EQ(sample_logits(logits.data(), 5, 1.0f, 1, u), 1);
  // top-2 only ever returns the two best.
  std::map<int, int> seen;
  for (int i = 1; i <= 100; ++i) seen[sample_logits(logits.data(), 5, 1.0f, 2, i / 100.0f)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], seen[3]);
  // A very low temperature is greedy too.
  EXPECT_EQ(sample_logits(logits.data(), 5, 1e-3f, 0, 0.99f), 1);
}

}  // namespace
}  // namespace tessera::train
