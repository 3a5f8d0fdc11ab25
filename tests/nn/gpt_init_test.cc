// GPT-2 initialisation statistics and its layout invariance (any shard of a parameter holds the
// values of the corresponding slice of the unsharded parameter).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tessera/nn/gpt.h"
#include "tessera/nn/parameters.h"

namespace tessera::nn {
namespace {

struct Stats {
  double mean, std;
};

Stats stats(const Tensor& t) {
  const auto v = t.to_vector();
  double s = 0, s2 = 0;
  for (float x : v) s += x;
  const double m = s / v.size();
  for (float x : v) s2 += (x - m) * (x - m);
  return {m, std::sqrt(s2 / v.size())};
}

TEST(GPTInit, StatisticsPerParameterKind) {
  GPTConfig c;  // L=4, C=256
  Allocator alloc("test");
  GPT m(c, 1, alloc);
  m.initialize(2024);
  const double proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  for (const ParamInfo& p : m.params().infos()) {
    const Tensor t = m.params().param(p.name);
    const std::string& n = p.name;
    auto ends = [&](const char* s) { return n.size() >= std::strlen(s) && n.ends_with(s); };
    if (ends(".bias")) {
      for (float x : t.to_vector()) ASSERT_EQ(x, 0.0f) << n;
    } else if (n.find("ln_") != std::string::npos) {
      for (float x : t.to_vector()) ASSERT_EQ(x, 1.0f) << n;
    } else {
      const double want = ends("c_proj.weight") ? proj_std : n == "wpe.weight" ? 0.01 : 0.02;
      const Stats s = stats(t);
      EXPECT_NEAR(s.std, want, 0.02 * want) << n;
      EXPECT_NEAR(s.mean, 0.0, 5.0 * want / std::sqrt(static_cast<double>(t.numel()))) << n;
    }
  }
  // Different parameters draw different streams.
  EXPECT_NE(m.params().param("h.0.attn.c_attn.weight").f32()[0],
            m.params().param("h.1.attn.c_attn.weight").f32()[0]);
}

// Tensor parallelism's column shard of c_attn (dim 1 viewed as 3 blocks: q, k, v) and a row
// range of wte hold exactly the unsharded values.
TEST(GPTInit, ShardedParametersReproduceTheUnshardedSlice) {
  const int64_t C = 16, V = 37;
  Allocator alloc("test");
  ParameterSet full;
  full.add("h.0.attn.c_attn.weight", {C, 3 * C}, Init::Normal, 0.02f, true);
  full.add("wte.weight", {V, C}, Init::Normal, 0.02f, true);
  full.materialize(alloc);
  full.initialize(5);
  const auto qkv = full.param("h.0.attn.c_attn.weight").to_vector();
  const auto wte = full.param("wte.weight").to_vector();
  const int tp = 2;
  for (int r = 0; r < tp; ++r) {
    const int64_t len = C / tp, off = r * len;
    ParameterSet shard;
    shard.add("h.0.attn.c_attn.weight", {C, 3 * C}, Init::Normal, 0.02f, true,
              ShardSpec{1, 3, off, len});
    shard.add("wte.weight", {V, C}, Init::Normal, 0.02f, true, ShardSpec{0, 1, 10 + r, 20});
    shard.materialize(alloc);
    shard.initialize(5);
    const auto s = shard.param("h.0.attn.c_attn.weight").to_vector();
    ASSERT_EQ(static_cast<int64_t>(s.size()), C * 3 * len);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t blk = 0; blk < 3; ++blk)
        for (int64_t j = 0; j < len; ++j)
          ASSERT_EQ(s[(i * 3 + blk) * len + j], qkv[i * 3 * C + blk * C + off + j]);
    const auto w = shard.param("wte.weight").to_vector();
    for (int64_t i = 0; i < 20 * C; ++i) ASSERT_EQ(w[i], wte[(10 + r) * C + i]);
  }
}

}  // namespace
}  // namespace tessera::nn
