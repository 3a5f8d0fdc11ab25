// The planner's pieces: cluster and model descriptions (parsing, errors), layout checks, the
// collective and FLOP models, one plan end to end, and rankings with their reasons.
#include "tessera/plan/planner.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/plan/collectives.h"
#include "tessera/plan/report.h"
#include "tessera/plan/work.h"

namespace tessera::plan {
namespace {

ModelSpec gpt2_small() {
  ModelSpec m;
  m.layers = 12;
  m.hidden = 768;
  m.heads = 12;
  m.seq = 1024;
  m.vocab = 50257;
  return m;
}

TEST(Cluster, ShippedDescriptionsLoadAndRoundTrip) {
  for (const char* name : {"dgx-a100-80gb", "dgx-h100", "dev-vm"}) {
    const ClusterSpec c = load_cluster(name);
    EXPECT_EQ(c.name, name);
    EXPECT_GT(c.devices(), 0);
    EXPECT_FALSE(c.sources.empty()) << name << " must say where its figures come from";
    const ClusterSpec again = cluster_from_json(to_json(c), "round trip");
    EXPECT_EQ(to_json(again), to_json(c));
  }
  const ClusterSpec a100 = load_cluster("dgx-a100-80gb");
  EXPECT_EQ(a100.devices(), 3072);
  EXPECT_DOUBLE_EQ(a100.peak_flops("fp16"), 312e12);
  EXPECT_DOUBLE_EQ(a100.inter_node.bandwidth_gbs, 25);  // 200 Gb/s per GPU
}

TEST(Cluster, BadDescriptionsNameTheKey) {
  nlohmann::json j = to_json(load_cluster("dgx-a100-80gb"));
  j.erase("nodes");
  EXPECT_THROW(
      {
        try {
          cluster_from_json(j, "x.json");
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("'nodes'"), std::string::npos) << e.what();
          throw;
        }
      },
      ConfigError);
  j = to_json(load_cluster("dgx-a100-80gb"));
  j["matmul_efficiency"] = 1.5;
  EXPECT_THROW(cluster_from_json(j, "x.json"), ConfigError);
  j = to_json(load_cluster("dgx-a100-80gb"));
  j["nodez"] = 3;
  EXPECT_THROW(cluster_from_json(j, "x.json"), ConfigError);
  EXPECT_THROW(load_cluster("no-such-cluster"), ConfigError);
}

TEST(Model, HuggingFaceConfigAndOwnKeys) {
  const ModelSpec m = model_from_json({{"n_layer", 12},
                                       {"n_embd", 768},
                                       {"n_head", 12},
                                       {"n_positions", 1024},
                                       {"vocab_size", 50257},
                                       {"model_type", "gpt2"}},
                                      "config.json");
  EXPECT_EQ(m, gpt2_small());
  EXPECT_EQ(m.total_params(), 124439808);  // GPT-2 small, tied head
  const ModelSpec own = model_from_json(to_json(m), "model.json");
  EXPECT_EQ(own, m);
  EXPECT_THROW(model_from_json({{"layers", 2}, {"hidden", 64}, {"heads", 3}}, "m.json"),
               ConfigError);
  EXPECT_THROW(model_from_json({{"layerz", 2}}, "m.json"), ConfigError);
}

TEST(Layout, ProblemsSayWhatToChange) {
  const ModelSpec m = gpt2_small();
  Layout l;
  l.tp = 5;
  l.dp = 3;
  EXPECT_EQ(layout_problems(l, m, 16, true).size(), 2u);  // heads and batch
  l = Layout{};
  l.pp = 2;
  l.schedule = parallel::ScheduleKind::Interleaved;
  l.virtual_stages = 2;
  l.dp = 1;
  l.micro_batch = 1;
  EXPECT_TRUE(layout_problems(l, m, 4, true).empty());
  EXPECT_FALSE(layout_problems(l, m, 3, true).empty());  // micro-batches not a multiple of pp
  l.virtual_stages = 8;                                  // 16 model stages > 14 units
  EXPECT_FALSE(layout_problems(l, m, 4, true).empty());
  l = Layout{};
  l.sp = true;
  EXPECT_FALSE(layout_problems(l, m, 4, true).empty());
  l = Layout{};
  l.ep = 2;
  l.dp = 2;
  EXPECT_FALSE(layout_problems(l, m, 4, true).empty());  // no experts
  // Grouped-query attention: tp splits the key/value heads too, under either engine's rules.
  ModelSpec gqa = m;
  gqa.arch = nn::Arch::Llama;
  gqa.kv_heads = 4;
  l = Layout{};
  l.tp = 4;
  EXPECT_TRUE(layout_problems(l, gqa, 4, true).empty());
  l.tp = 6;  // divides the 12 heads, not the 4 key/value heads
  const std::vector<std::string> p = layout_problems(l, gqa, 4, true);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "tp=6 must divide the 4 key/value heads (grouped-query attention)");
  EXPECT_FALSE(layout_problems(l, gqa, 4, false).empty());
}

// HSDP (Layout::zero_shard): "host" resolves to a node's gradient-group ranks; the state is
// ZeRO's over the shard group; the bytes add each shard's all-reduce over its replicas; the
// parameter gathers stay inside a node, so the data-parallel time is shorter than plain ZeRO-3's
// across nodes.
TEST(Plan, HybridShardingShardsInsideANodeAndAllReducesAcross) {
  PlanRequest r;
  r.model = gpt2_small();
  r.cluster = with_devices(load_cluster("dgx-a100-80gb"), 16);  // 2 nodes x 8
  r.global_batch = 16;
  Layout l;
  l.dp = 16;
  l.micro_batch = 1;
  l.zero = parallel::ZeroStage::Parameters;
  const Prediction plain = plan_layout(r, l);
  l.zero_shard = Layout::kShardByHost;
  const Prediction hsdp = plan_layout(r, l);
  ASSERT_TRUE(plain.ok() && hsdp.ok()) << (hsdp.problems.empty() ? "" : hsdp.problems[0]);
  EXPECT_EQ(hsdp.layout.zero_shard, 8);  // a node's 8 data-parallel ranks
  EXPECT_NE(hsdp.layout.str().find("shard=8"), std::string::npos) << hsdp.layout.str();
  EXPECT_EQ(to_json(hsdp.layout)["zero_shard"], 8);
  // Model states sharded over 8 ranks instead of 16: twice as much per rank (padding aside).
  EXPECT_NEAR(hsdp.memory.optimizer_state / plain.memory.optimizer_state, 2.0, 0.01);
  EXPECT_NEAR(hsdp.memory.parameters / plain.memory.parameters, 2.0, 0.01);
  // Plain ZeRO-3 gathers parameters over both nodes twice per micro-batch; HSDP inside a node.
  EXPECT_LT(hsdp.rank_time[0].dp_comm, plain.rank_time[0].dp_comm);

  // Bytes per rank at ZeRO 2, one micro-batch: the shard group's reduce-scatter, the replicas'
  // all-reduce of a shard (2 (R-1)/R of E/8 elements), the parameter all-gather after the step;
  // E, the padded parameters, from ZeRO 0's all-reduce (2 (N-1)/N x 4 bytes x E).
  l.zero_shard = 0;
  l.zero = parallel::ZeroStage::None;
  const double E = plan_layout(r, l).dp_bytes / (2.0 * 15 / 16 * 4);
  l.zero = parallel::ZeroStage::Gradients;
  l.zero_shard = 8;
  const double want = 7.0 / 8 * 4 * E + 2.0 * 1 / 2 * 4 * E / 8 + 7.0 / 8 * 4 * E;
  EXPECT_NEAR(plan_layout(r, l).dp_bytes, want, 1e-3 * want);

  // Resolution: a gradient group inside one node is plain ZeRO; a tensor-parallel group of a
  // whole node leaves one data-parallel rank per node.
  l.zero_shard = Layout::kShardByHost;
  l.dp = 8;
  EXPECT_EQ(resolve_zero_shard(r.cluster, l), 0);
  l.dp = 2;
  l.tp = 8;
  EXPECT_EQ(resolve_zero_shard(r.cluster, l), 1);
  // JSON: "host" and numbers.
  EXPECT_EQ(layout_from_json(nlohmann::json{{"dp", 16}, {"zero", 3}, {"zero_shard", "host"}}, "t")
                .zero_shard,
            Layout::kShardByHost);
  EXPECT_EQ(to_json(l)["zero_shard"], "host");
}

TEST(Layout, HybridShardingProblems) {
  const ModelSpec m = gpt2_small();
  Layout l;
  l.dp = 4;
  l.zero = parallel::ZeroStage::Parameters;
  l.zero_shard = 2;
  EXPECT_TRUE(layout_problems(l, m, 16, true).empty());
  l.zero_shard = 3;
  ASSERT_EQ(layout_problems(l, m, 16, true).size(), 1u);
  EXPECT_NE(layout_problems(l, m, 16, true)[0].find("must divide the 4 ranks"), std::string::npos);
  l.zero_shard = 2;
  l.zero = parallel::ZeroStage::None;
  ASSERT_EQ(layout_problems(l, m, 16, true).size(), 1u);
  EXPECT_NE(layout_problems(l, m, 16, true)[0].find("needs zero 1, 2 or 3"), std::string::npos);
}

TEST(Collectives, RingAndHierarchicalFormulas) {
  ClusterSpec c = load_cluster("dgx-a100-80gb");
  const double S = 1e9;
  // Within a node: 2 (n-1)/n x S / 300 GB/s + 2 (n-1) x 2 us.
  EXPECT_NEAR(all_reduce_seconds(c, Group{8, 8}, S), 2 * 7.0 / 8 * S / 300e9 + 14 * 2e-6, 1e-12);
  // Across 4 nodes, one rank per node: the network only.
  EXPECT_NEAR(all_reduce_seconds(c, Group{4, 1}, S), 2 * 3.0 / 4 * S / 25e9 + 6 * 5e-6, 1e-12);
  // 32 ranks on 4 nodes: intra reduce-scatter, inter on S / 8, intra all-gather.
  const double hier =
      2 * (7 * 2e-6 + 7.0 / 8 * S / 300e9) + 2 * (3 * 5e-6 + 3.0 / 4 * S / 8 / 25e9);
  EXPECT_NEAR(all_reduce_seconds(c, Group{32, 8}, S), hier, 1e-12);
  EXPECT_EQ(all_reduce_seconds(c, Group{1, 1}, S), 0);
  Layout l;
  l.tp = 8;
  l.dp = 4;
  EXPECT_EQ(tp_group(c, l).per_node, 8);
  EXPECT_EQ(dp_group(c, l).per_node, 1);  // tensor parallelism fills the node
  l.tp = 2;
  EXPECT_EQ(dp_group(c, l).per_node, 4);
}

TEST(Work, CausalBlocksAndFlops) {
  EXPECT_DOUBLE_EQ(causal_block_fraction(256), 0.625);  // docs/PERFORMANCE.md
  EXPECT_DOUBLE_EQ(causal_block_fraction(128), 0.75);
  EXPECT_DOUBLE_EQ(causal_block_fraction(16), 1.0);
  const ModelSpec m = gpt2_small();
  Layout l;
  l.micro_batch = 2;
  WorkRules dense;
  dense.causal_blocks = false;
  const UnitWork w = unit_work(m, l, 1, dense);
  const double BT = 2 * 1024.0, C = 768;
  EXPECT_DOUBLE_EQ(w.fwd_flops, 24 * BT * C * C + 4 * 2 * 1024.0 * 1024 * C);
  EXPECT_DOUBLE_EQ(w.bwd_flops, 2 * w.fwd_flops);
  EXPECT_DOUBLE_EQ(w.wgrad_flops, 24 * BT * C * C);
}

TEST(Plan, OneLayoutEndToEnd) {
  PlanRequest r;
  r.model = gpt2_small();
  r.cluster = with_devices(load_cluster("dgx-a100-80gb"), 16);
  r.global_batch = 64;
  Layout l;
  l.dp = 4;
  l.tp = 2;
  l.pp = 2;
  l.zero = parallel::ZeroStage::OptimizerState;
  l.micro_batch = 2;
  l.schedule = parallel::ScheduleKind::OneFOneB;
  const Prediction p = plan_layout(r, l);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p.fits);
  EXPECT_TRUE(p.simulated);
  EXPECT_EQ(p.micro_batches, 8);
  EXPECT_EQ(p.rank_memory.size(), 2u);
  EXPECT_GT(p.step_seconds, 0);
  EXPECT_GT(p.bubble, 0);
  EXPECT_LT(p.bubble, 0.5);
  EXPECT_GT(p.mfu, 0);
  EXPECT_LT(p.mfu, r.cluster.matmul_efficiency);
  // 1F1B: the first stage holds pp micro-batches, the last one.
  EXPECT_DOUBLE_EQ(p.in_flight[0], 2);
  EXPECT_DOUBLE_EQ(p.in_flight[1], 1);
  const nlohmann::json j = to_json(p);
  EXPECT_EQ(j["layout"]["schedule"], "1f1b");
  EXPECT_EQ(j["pipeline_ranks"].size(), 2u);
  EXPECT_NE(format_prediction(r, p).find("fits"), std::string::npos);
}

TEST(Plan, OverflowingLayoutsSayWhichTerm) {
  PlanRequest r;
  r.model.layers = 96;
  r.model.hidden = 12288;
  r.model.heads = 96;
  r.model.seq = 2048;
  r.model.vocab = 51200;
  r.cluster = with_devices(load_cluster("dgx-a100-80gb"), 8);
  r.global_batch = 8;
  Layout l;
  l.dp = 8;
  l.micro_batch = 1;
  Prediction p = plan_layout(r, l);  // GPT-3 replicated on 8 GPUs: 2.8 TB of model states
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.why_not.find("optimizer state"), std::string::npos) << p.why_not;
  EXPECT_NE(p.why_not.find("model states alone"), std::string::npos) << p.why_not;
  r.model.layers = 2;
  r.model.hidden = 1024;
  r.model.heads = 16;
  r.model.seq = 32768;  // activations dominate
  l.micro_batch = 1;
  p = plan_layout(r, l);
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.why_not.find("activations overflow"), std::string::npos) << p.why_not;
}

TEST(Plan, RankingOrdersByStepTimeAndExplainsTheRest) {
  PlanRequest r;
  r.model.layers = 40;  // 13B parameters on 16 GPUs: replicated, they do not fit
  r.model.hidden = 5120;
  r.model.heads = 40;
  r.model.seq = 2048;
  r.model.vocab = 51200;
  r.cluster = with_devices(load_cluster("dgx-a100-80gb"), 16);
  r.global_batch = 32;
  LayoutSpace space;
  space.micro_batch_sizes = {1, 2};
  const Ranking k = rank_layouts(r, 16, space, 8);
  EXPECT_GT(k.considered, 100);
  ASSERT_FALSE(k.fitting.empty());
  ASSERT_FALSE(k.not_fitting.empty());
  EXPECT_EQ(k.simulated, 8);
  for (size_t i = 1; i < static_cast<size_t>(k.simulated); ++i)
    EXPECT_LE(k.fitting[i - 1].step_seconds, k.fitting[i].step_seconds);
  for (const Prediction& p : k.fitting) {
    EXPECT_EQ(p.layout.devices(), 16);
    EXPECT_LE(p.memory.total(), p.capacity);
  }
  for (const Prediction& p : k.not_fitting) EXPECT_FALSE(p.why_not.empty());
  const nlohmann::json j = to_json(r, k, 3);
  EXPECT_EQ(j["fitting"].size(), k.fitting.size());
  EXPECT_TRUE(j["fitting"][2].contains("pipeline_ranks"));
  EXPECT_FALSE(j["fitting"][3].contains("pipeline_ranks"));
  EXPECT_NE(format_ranking(r, k, 5).find("do not fit"), std::string::npos);
}

TEST(Plan, MoreRanksThanDevicesNeedOversubscribe) {
  PlanRequest r;
  r.model = gpt2_small();
  r.cluster = load_cluster("dev-vm");
  r.global_batch = 8;
  Layout l;
  l.dp = 2 * r.cluster.devices();
  l.micro_batch = 1;
  EXPECT_FALSE(plan_layout(r, l).ok());
  r.oversubscribe = true;
  const Prediction shared = plan_layout(r, l);
  ASSERT_TRUE(shared.ok());
  l.dp = r.cluster.devices();
  r.global_batch = 4;
  const Prediction alone = plan_layout(r, l);
  // Twice the ranks on the same cores, each with the same work: twice the step, half the memory.
  EXPECT_NEAR(shared.step_seconds / alone.step_seconds, 2.0, 0.2);
  EXPECT_DOUBLE_EQ(shared.capacity, alone.capacity / 2);
}

}  // namespace
}  // namespace tessera::plan
