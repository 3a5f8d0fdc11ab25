#include "tessera/nn/parameters.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tessera/core/error.h"

namespace tessera::nn {
namespace {

TEST(ParameterSet, FlatBuffersWithAlignedViews) {
  Allocator alloc("test");
  ParameterSet ps;
  ps.add("a", {3, 5}, Init::Normal, 0.02f, true);
  ps.add("b", {7}, Init::Ones, 0, false);
  ps.materialize(alloc);
  EXPECT_EQ(ps.infos()[1].offset % 16, 0);
  EXPECT_EQ(ps.param("a").shape(), (Shape{3, 5}));
  EXPECT_TRUE(ps.param("b").shares_storage_with(ps.flat_params()));
  EXPECT_EQ(ps.global_numel(), 22);
  EXPECT_EQ(alloc.in_use(MemCategory::Parameters), static_cast<size_t>(ps.numel()) * 4);
  EXPECT_EQ(alloc.in_use(MemCategory::Gradients), static_cast<size_t>(ps.numel()) * 4);
  EXPECT_THROW(ps.index("c"), ConfigError);
  ps.initialize(1);
  for (float v : ps.param("b").to_vector()) EXPECT_EQ(v, 1.0f);
}

// A shard of a parameter holds exactly the values the unsharded parameter has at the same global
// coordinates: column blocks of a fused [C, 3C] weight, and a row range of an embedding.
TEST(ParameterSet, ShardsReproduceSingleDeviceInitialisation) {
  const int64_t C = 8, tp = 2;
  Allocator alloc("test");
  ParameterSet whole;
  whole.add("h.0.attn.c_attn.weight", {C, 3 * C}, Init::Normal, 0.02f, true);
  whole.add("wte.weight", {10, C}, Init::Normal, 0.02f, true);
  whole.materialize(alloc);
  whole.initialize(1234);
  std::vector<float> w = whole.param(0).to_vector();
  std::vector<float> e = whole.param(1).to_vector();
  for (int64_t r = 0; r < tp; ++r) {
    ParameterSet shard;
    shard.add("h.0.attn.c_attn.weight", {C, 3 * C}, Init::Normal, 0.02f, true,
              ShardSpec{1, 3, r * C / tp, C / tp});
    shard.add("wte.weight", {10, C}, Init::Normal, 0.02f, true, ShardSpec{0, 1, r * 5, 5});
    shard.materialize(alloc);
    shard.initialize(1234);
    Tensor s = shard.param(0);
    ASSERT_EQ(s.shape(), (Shape{C, 3 * C / tp}));
    const float* sp = s.f32();
    for (int64_t i = 0; i < C; ++i)
      for (int64_t blk = 0; blk < 3; ++blk)
        for (int64_t j = 0; j < C / tp; ++j)
          EXPECT_EQ(sp[i * (3 * C / tp) + blk * (C / tp) + j],
                    w[i * 3 * C + blk * C + r * C / tp + j]);
    std::vector<float> es = shard.param(1).to_vector();
    for (int64_t i = 0; i < 5 * C; ++i) EXPECT_EQ(es[i], e[r * 5 * C + i]);
  }
}

TEST(ParameterSet, BadShardsAreErrors) {
  ParameterSet ps;
  EXPECT_THROW(ps.add("x", {6, 4}, Init::Zeros, 0, false, ShardSpec{1, 3, 0, 1}), ShapeError);
  EXPECT_THROW(ps.add("y", {6, 4}, Init::Zeros, 0, false, ShardSpec{0, 2, 2, 2}), ShapeError);
  EXPECT_THROW(ps.add("z", {6}, Init::Zeros, 0, false, ShardSpec{1, 1, 0, 1}), ShapeError);
}

}  // namespace
}  // namespace tessera::nn

namespace tessera::nn {
namespace {

// A ZeRO-3 rank initialises only its slice of the flat layout; any slice must hold exactly what
// the full initialisation puts there, padding included.
TEST(ParameterSet, InitialValuesOfAnyRangeMatchFullInitialisation) {
  Allocator alloc("test");
  ParameterSet ps;
  ps.add("w", {5, 7}, Init::Normal, 0.02f, true);
  ps.add("g", {9}, Init::Ones, 0, false);
  ps.pad_to_multiple(64);
  ps.add("b", {3}, Init::Zeros, 0, false);
  ps.add("v", {4, 6}, Init::Normal, 0.02f, true, ShardSpec{1, 2, 1, 2});
  ps.materialize(alloc);
  EXPECT_EQ(ps.infos()[2].offset % 64, 0);
  ps.initialize(99);
  std::vector<float> full = ps.flat_params().to_vector();
  for (int64_t begin : {0, 3, 17, 40, 64, 70}) {
    for (int64_t end : {begin, begin + 1, begin + 30, ps.numel()}) {
      if (end > ps.numel() || end < begin) continue;
      std::vector<float> part(end - begin, -1.0f);
      ps.initial_values(99, begin, end, part.data());
      for (int64_t i = begin; i < end; ++i)
        ASSERT_EQ(part[i - begin], full[i]) << begin << ".." << end << " at " << i;
    }
  }
  EXPECT_EQ(ps.params_in(0, ps.numel()), (std::pair<int, int>{0, 4}));
  EXPECT_EQ(ps.params_in(64, ps.numel()), (std::pair<int, int>{2, 4}));
  EXPECT_EQ(ps.param_data(1), ps.flat_params().f32() + ps.infos()[1].offset);
}

// From 1M elements the rank's compute threads fill pieces of the range: bitwise what one thread
// writes, with pieces that cut through parameters (a sharded one included) and their padding.
TEST(ParameterSet, ThreadedInitialisationEqualsOneThreadBitwise) {
  Allocator alloc("test");
  ParameterSet ps;
  ps.add("w", {700, 1001}, Init::Normal, 0.02f, true);
  ps.add("g", {333}, Init::Ones, 0, false);
  ps.add("v", {600, 2000}, Init::Normal, 0.02f, true, ShardSpec{1, 2, 100, 400});
  ps.materialize(alloc);
  ASSERT_GE(ps.numel(), int64_t{1} << 20);
  const int saved = openblas_get_num_threads();
  std::vector<std::vector<float>> by_threads;
  for (int threads : {1, 2, 3}) {
    openblas_set_num_threads(threads);
    ps.initialize(7);
    by_threads.push_back(ps.flat_params().to_vector());
  }
  // A range that does not start at 0 (a ZeRO-3 shard), on 2 threads.
  openblas_set_num_threads(2);
  const int64_t begin = 12345;
  std::vector<float> part(static_cast<size_t>(ps.numel() - begin));
  ps.initial_values(7, begin, ps.numel(), part.data());
  openblas_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(part.data(), by_threads[0].data() + begin, part.size() * 4), 0);
  for (size_t t = 1; t < by_threads.size(); ++t)
    EXPECT_EQ(std::memcmp(by_threads[t].data(), by_threads[0].data(), by_threads[0].size() * 4), 0)
        << t + 1 << " threads";
  EXPECT_NE(by_threads[0][5], 0.0f);  // the values are there
}

TEST(ParameterSet, ShardedStagesNeedNotAllocateFullBuffers) {
  Allocator alloc("test");
  ParameterSet ps;
  ps.add("w", {100}, Init::Normal, 0.02f, true);
  ps.materialize(alloc, /*full_params=*/false, /*full_grads=*/false);
  EXPECT_EQ(alloc.in_use(), 0u);
  EXPECT_EQ(ps.param_data(0), nullptr);
  EXPECT_THROW(ps.initialize(1), Error);
}

}  // namespace
}  // namespace tessera::nn
