// Matmul efficiency by GEMM shape (plan/gemm_efficiency.h): the table's interpolation and JSON,
// clusters without it (the one matmul_efficiency, as before), and the tessera engine costing each
// GEMM at its own shape (plan/work.h).
#include "tessera/plan/gemm_efficiency.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/nn/gpt_costs.h"
#include "tessera/plan/calibrate.h"
#include "tessera/plan/engine.h"
#include "tessera/plan/planner.h"
#include "tessera/plan/work.h"

namespace tessera::plan {
namespace {

// A table over `dims` whose value is f(M, N, K) at each grid point.
template <typename F>
GemmEfficiency table(const std::vector<double>& dims, F f) {
  std::vector<double> v;
  for (double M : dims)
    for (double N : dims)
      for (double K : dims) v.push_back(f(M, N, K));
  return GemmEfficiency(dims, v);
}

ModelSpec small_model(int heads) {
  ModelSpec m;
  m.layers = 4;
  m.hidden = 256;
  m.heads = heads;
  m.seq = 128;
  m.vocab = 512;
  return m;
}

ClusterSpec cpu_cluster() {
  ClusterSpec c = load_cluster("dev-vm");
  c.gemm_efficiency = GemmEfficiency();
  c.attention_efficiency = AttentionEfficiency();
  return c;
}

TEST(GemmEfficiency, InterpolatesInLogSpaceAndClampsAtTheEdges) {
  const GemmEfficiency g = table({16, 64, 256}, [](double M, double, double K) {
    return M == 16 ? 0.2 : K == 256 ? 0.9 : 0.6;
  });
  EXPECT_DOUBLE_EQ(g.at(16, 64, 64), 0.2);
  EXPECT_DOUBLE_EQ(g.at(64, 16, 256), 0.9);
  EXPECT_DOUBLE_EQ(g.at(32, 64, 64), 0.4);      // halfway between 16 and 64 in log2
  EXPECT_DOUBLE_EQ(g.at(64, 64, 128), 0.75);    // halfway between K = 64 and 256
  EXPECT_DOUBLE_EQ(g.at(4, 64, 64), 0.2);       // below the grid: its first point
  EXPECT_DOUBLE_EQ(g.at(9000, 64, 9000), 0.9);  // above: its last
  EXPECT_THROW(GemmEfficiency({16, 8}, std::vector<double>(8, 0.5)), ConfigError);
  EXPECT_THROW(GemmEfficiency({16, 32}, std::vector<double>(7, 0.5)), ConfigError);
}

// Operands within half the cache take the hot grid, beyond twice it the cold one, a blend between.
TEST(GemmEfficiency, OperandsBeyondTheCacheTakeTheColdGrid) {
  const GemmEfficiency g({16, 4096}, std::vector<double>(8, 0.9), std::vector<double>(8, 0.6),
                         1 << 20);
  EXPECT_DOUBLE_EQ(g.at(64, 64, 64), 0.9);                                         // 48 KiB
  EXPECT_DOUBLE_EQ(g.at(1024, 1024, 1024), 0.6);                                   // 12 MiB
  EXPECT_NEAR(g.at(256, 256, 256), 0.9 - 0.3 * (std::log2(0.75) + 1) / 2, 1e-12);  // 768 KiB
  EXPECT_THROW(GemmEfficiency({16}, {0.5}, {0.5, 0.5}, 1), ConfigError);
}

TEST(GemmEfficiency, RoundTripsThroughTheClusterJson) {
  ClusterSpec c = cpu_cluster();
  std::vector<double> cold;
  for (int i = 0; i < 27; ++i) cold.push_back(0.3 + 0.01 * i);
  const GemmEfficiency hot = table({16, 128, 1024}, [](double M, double N, double K) {
    return 0.1 + 0.8 * (std::min({M, N, K}) / 1024) + 1e-3 * M / N;
  });
  c.gemm_efficiency = GemmEfficiency(hot.dims(), hot.values(), cold, 2 << 20);
  c.attention_efficiency = {
      {64, 128, 256}, {32, 64}, {0.2, 0.3, 0.25, 0.35, 0.3, 0.4}, {0.5, 0.6, 0.55, 0.65, 0.6, 0.7}};
  const nlohmann::json j = to_json(c);
  ASSERT_TRUE(j.contains("gemm_efficiency"));
  EXPECT_EQ(j.at("gemm_efficiency").at("efficiency").size(), 3u);
  const ClusterSpec again = cluster_from_json(j, "round trip");
  EXPECT_TRUE(again.gemm_efficiency == c.gemm_efficiency);
  EXPECT_TRUE(again.attention_efficiency == c.attention_efficiency);
  EXPECT_EQ(to_json(again), j);
  EXPECT_DOUBLE_EQ(again.attention_efficiency.at(false, 128, 64), 0.35);
  EXPECT_NEAR(again.attention_efficiency.at(true, 181.019336, 32), 0.575, 1e-9);  // 2^7.5

  nlohmann::json bad = j;
  bad["gemm_efficiency"]["efficiency"][1].erase(0);
  EXPECT_THROW(cluster_from_json(bad, "x.json"), ConfigError);
  bad = j;
  bad["gemm_efficiency"]["efficiency"][0][0][0] = -1;
  EXPECT_THROW(cluster_from_json(bad, "x.json"), ConfigError);
  bad = j;
  bad["gemm_efficiency"].erase("cache_bytes");
  EXPECT_THROW(cluster_from_json(bad, "x.json"), ConfigError);
  bad = j;
  bad["attention_efficiency"]["forward"].erase(0);
  EXPECT_THROW(cluster_from_json(bad, "x.json"), ConfigError);
}

TEST(GemmEfficiency, AFileWithoutTheTableLoadsAndPlansWithTheOneEfficiency) {
  nlohmann::json j = to_json(load_cluster("dev-vm"));
  j.erase("gemm_efficiency");
  j.erase("attention_efficiency");
  const ClusterSpec old = cluster_from_json(j, "old.json");
  EXPECT_TRUE(old.gemm_efficiency.empty());
  EXPECT_TRUE(old.attention_efficiency.empty());
  PlanRequest r;
  r.model = small_model(4);
  r.cluster = old;
  r.global_batch = 8;
  Layout l;
  l.micro_batch = 8;
  const Prediction p = plan_layout(r, l);
  ASSERT_TRUE(p.ok());
  // The one efficiency: every FLOP at peak x matmul_efficiency, as before the table existed.
  const double e = old.matmul_efficiency;
  r.cluster.gemm_efficiency = table({16, 4096}, [&](double, double, double) { return e; });
  const Prediction same = plan_layout(r, l);
  EXPECT_NEAR(same.step_seconds, p.step_seconds, 1e-12 * p.step_seconds);
  // The GPU clusters have none.
  EXPECT_TRUE(load_cluster("dgx-a100-80gb").gemm_efficiency.empty());
}

// Efficiency 1 everywhere except GEMMs whose K is the head size (32): Q K^T and dP = dO V^T (the
// fused attention's tiles of 64 queries against 64 keys).
TEST(GemmEfficiency, TheEngineCostsThePerHeadAttentionGemmsAtTheirShape) {
  const ModelSpec m = small_model(8);  // head size 32
  const GemmEfficiency g =
      table({16, 32, 64, 2048}, [](double, double, double K) { return K <= 32 ? 0.25 : 1.0; });
  EngineOptions o;
  o.gemm_efficiency = g;
  const auto engine = make_engine("tessera", o);
  Layout l;
  l.micro_batch = 2;
  const parallel::UnitRange block{1, 1, false, false};
  const StageSheet s = engine->stage(m, l, block);
  ASSERT_TRUE(s.gemm_costed);
  const nn::BlockFlops f = nn::block_flops(to_gpt_config(m), 0, m.seq);
  const double BT = 2.0 * m.seq;
  const double core = BT * f.attention_core * causal_block_fraction(m.seq);
  const double linear = s.fwd_flops - core;
  // Forward: Q K^T (half the core) at 0.25, P V at 1; backward: Q K^T again and dP at 0.25, dV,
  // dQ, dK at 1.
  EXPECT_NEAR(s.fwd_cost, linear + core / 2 / 0.25 + core / 2, 1e-9 * s.fwd_cost);
  EXPECT_NEAR(s.bwd_cost, 2 * linear + core / 0.25 + 3 * core / 2, 1e-9 * s.bwd_cost);
  EXPECT_NEAR(s.bwd_flops, 2 * s.fwd_flops + core / 2, 1e-9 * s.bwd_flops);
  EXPECT_NEAR(s.wgrad_cost, s.wgrad_flops, 1e-9 * s.wgrad_flops);

  // At head size 64 the same table leaves attention at full rate.
  const StageSheet wide = engine->stage(small_model(4), l, block);
  EXPECT_NEAR(wide.fwd_cost, wide.fwd_flops, 1e-9 * wide.fwd_flops);
  // Without a table the sheet carries no costs (the planner uses matmul_efficiency).
  EXPECT_FALSE(make_engine("tessera")->stage(m, l, block).gemm_costed);
  EXPECT_FALSE(make_engine("megatron", o)->stage(m, l, block).gemm_costed);
}

// With the attention kernel measured, its forward and backward take the kernel's rate at the
// model's context and head size, and the softmax's bytes leave the elementwise traffic.
TEST(GemmEfficiency, TheAttentionKernelTakesItsMeasuredRate) {
  const ModelSpec m = small_model(8);  // T = 128, head size 32
  EngineOptions o;
  o.gemm_efficiency = table({16, 4096}, [](double, double, double) { return 1.0; });
  const auto engine = make_engine("tessera", o);
  o.attention_efficiency = {{64, 256}, {16, 64}, {0.2, 0.4, 0.4, 0.8}, {0.5, 0.5, 0.5, 0.5}};
  const auto measured = make_engine("tessera", o);
  Layout l;
  l.micro_batch = 2;
  const parallel::UnitRange block{1, 1, false, false};
  const StageSheet gemm = engine->stage(m, l, block), kernel = measured->stage(m, l, block);
  const double core = 2.0 * m.seq * nn::block_flops(to_gpt_config(m), 0, m.seq).attention_core *
                      causal_block_fraction(m.seq);
  const double linear = gemm.fwd_flops - core;
  // T = 128 and hs = 32 are halfway (in log2) between the grid points: forward 0.45.
  EXPECT_NEAR(kernel.fwd_cost, linear + core / 0.45, 1e-9 * kernel.fwd_cost);
  // Backward: twice the forward's FLOPs and the fused kernel's Q K^T again.
  EXPECT_NEAR(kernel.bwd_cost, 2 * linear + 2.5 * core / 0.5, 1e-9 * kernel.bwd_cost);
  // The softmax pass (2 x 4 bytes per computed score, forward) is in the kernel's time.
  const double scores = 2.0 * m.heads * m.seq * m.seq * causal_block_fraction(m.seq);
  EXPECT_NEAR(gemm.fwd_bytes - kernel.fwd_bytes, 2 * 4 * scores, 1e-6);
}

// A smaller GEMM runs at a lower rate: the plan of the same work slows where the table says so.
TEST(GemmEfficiency, SmallerGemmsPlanSlowerWhenTheTableSaysSo) {
  PlanRequest r;
  r.model = small_model(8);
  r.cluster = cpu_cluster();
  r.global_batch = 8;
  const GemmEfficiency flat = table({16, 4096}, [](double, double, double) { return 0.9; });
  // Efficiency rising with the smallest dimension, 0.3 at 16 to 0.9 at 4096.
  const GemmEfficiency rising = table({16, 4096}, [](double M, double N, double K) {
    return std::min({M, N, K}) <= 16 ? 0.3 : 0.9;
  });
  Layout one, tp2;
  one.micro_batch = 8;
  tp2.micro_batch = 8;
  tp2.tp = 2;
  r.oversubscribe = true;
  r.cluster.gemm_efficiency = flat;
  const double one_flat = plan_layout(r, one).step_seconds,
               tp_flat = plan_layout(r, tp2).step_seconds;
  r.cluster.gemm_efficiency = rising;
  const double one_rising = plan_layout(r, one).step_seconds,
               tp_rising = plan_layout(r, tp2).step_seconds;
  EXPECT_GT(one_rising, one_flat);
  // The split GEMMs are narrower, so tensor parallelism loses more to the smaller shapes.
  EXPECT_GT(tp_rising / tp_flat, one_rising / one_flat);
}

}  // namespace
}  // namespace tessera::plan

namespace tessera::plan {
namespace {

// `tessera plan --calibrate --quick` measures both tables, and a plan on its file costs GEMMs.
TEST(GemmEfficiency, QuickCalibrationMeasuresTheTables) {
  CalibrationOptions o;
  o.quick = true;
  const ClusterSpec c = calibrate_this_machine(o, nullptr);
  ASSERT_FALSE(c.gemm_efficiency.empty());
  ASSERT_FALSE(c.attention_efficiency.empty());
  EXPECT_EQ(c.gemm_efficiency.dims(), (std::vector<double>{16, 64, 256, 1024}));
  EXPECT_EQ(c.gemm_efficiency.cold_values().size(), 64u);
  EXPECT_GT(c.gemm_efficiency.cache_bytes(), 0);
  for (double T : {64.0, 256.0})
    for (double hs : {32.0, 64.0})
      for (bool backward : {false, true}) {
        const double e = c.attention_efficiency.at(backward, T, hs);
        EXPECT_GT(e, 0.0);
        EXPECT_LE(e, 2.0);
      }
  const ClusterSpec again = cluster_from_json(to_json(c), "calibrated");
  EXPECT_TRUE(again.gemm_efficiency == c.gemm_efficiency);
  EngineOptions eo;
  eo.gemm_efficiency = again.gemm_efficiency;
  eo.attention_efficiency = again.attention_efficiency;
  Layout l;
  l.micro_batch = 2;
  EXPECT_TRUE(
      make_engine("tessera", eo)->stage(small_model(4), l, {1, 1, false, false}).gemm_costed);
}

}  // namespace
}  // namespace tessera::plan
