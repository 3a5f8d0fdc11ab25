// Bytes between nodes per step (plan/cross_node.h), as the hierarchical backend sends them with
// one process per node: each collective's formula on hand-counted groups, and whole layouts on
// 2 nodes x 2 devices (and 3 x 2 where the chain's formula differs) against the figures worked out
// by hand from the layout's parameter elements E (bench/cluster/bytes.sh measures the same on the
// test cluster).
#include "tessera/plan/cross_node.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tessera/plan/planner.h"
#include "tessera/plan/report.h"

namespace tessera::plan {
namespace {

TEST(CrossNode, CollectivesOnTwoAndThreeNodes) {
  const double S = 1000;
  // 2 nodes x 2: the chain sends the buffer across once and the result back once; the
  // reduce-scatter's result goes back only for the 2 owners on the first node; every block of an
  // all-gather crosses once; half of an all-to-all's blocks cross.
  const std::vector<int> four = {0, 1, 2, 3};
  EXPECT_DOUBLE_EQ(all_reduce_across(four, 2, S, S), 2 * S);
  EXPECT_DOUBLE_EQ(reduce_scatter_across(four, 2, S, S), 1.5 * S);
  EXPECT_DOUBLE_EQ(all_gather_across(four, 2, S), S);
  EXPECT_DOUBLE_EQ(all_to_all_across(four, 2, S), 4 * 2 * S / 4);
  // bf16: partial sums of the buffer in fp32 (twice the bytes), the result in bf16.
  EXPECT_DOUBLE_EQ(all_reduce_across(four, 2, S / 2, S), 1.5 * S);
  // A replica group (one rank per node) and a group inside one node.
  EXPECT_DOUBLE_EQ(all_reduce_across({0, 2}, 2, S, S), 2 * S);
  EXPECT_DOUBLE_EQ(all_reduce_across({2, 3}, 2, S, S), 0);
  EXPECT_DOUBLE_EQ(reduce_scatter_across({0, 1}, 2, S, S), 0);
  EXPECT_DOUBLE_EQ(all_gather_across({1}, 2, S), 0);
  // 3 nodes x 2: two hops forward, the result to the two other nodes; the reduce-scatter's
  // result to the 4 owners off the last node; the all-gather's blocks to 2 other nodes each.
  const std::vector<int> six = {0, 1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(all_reduce_across(six, 2, S, S), 4 * S);
  EXPECT_DOUBLE_EQ(reduce_scatter_across(six, 2, S, S), 2 * S + S * 4 / 6);
  EXPECT_DOUBLE_EQ(all_gather_across(six, 2, S), 2 * S);
  EXPECT_DOUBLE_EQ(all_to_all_across(six, 2, S), 6 * 4 * S / 6);
  // Members on nodes 0 and 2 (ranks 0, 1, 4, 5): two runs, as two neighbouring nodes.
  EXPECT_DOUBLE_EQ(all_reduce_across({0, 1, 4, 5}, 2, S, S), 2 * S);
}

PlanRequest request(int nodes) {
  PlanRequest r;
  r.model.layers = 2;
  r.model.hidden = 64;
  r.model.heads = 4;
  r.model.seq = 32;
  r.model.vocab = 128;
  r.cluster = load_cluster("dev-vm");  // tessera's fp32 accounting
  r.cluster.nodes = nodes;
  r.cluster.devices_per_node = 2;
  r.global_batch = 8;
  return r;
}

Prediction plan(const PlanRequest& r, Layout l) {
  const Prediction p = plan_layout(r, l);
  EXPECT_TRUE(p.ok()) << (p.problems.empty() ? "" : p.problems[0]);
  return p;
}

Layout dp(int n, parallel::ZeroStage z, int micro_batch, int shard = 0) {
  Layout l;
  l.dp = n;
  l.zero = z;
  l.micro_batch = micro_batch;
  l.zero_shard = shard;
  return l;
}

using parallel::ZeroStage;

// Data parallelism over 2 nodes x 2 (E parameter elements per rank, as its ZeRO stage pads them;
// 4 bytes each; m micro-batches). ZeRO-0: one all-reduce, 2 x 4E. ZeRO-1: a reduce-scatter
// (4E forward, 2E back) and the parameters' all-gather (4E). ZeRO-2: the reduce-scatter every
// micro-batch. ZeRO-3: the reduce-scatter and two all-gathers every micro-batch. HSDP by host:
// only each shard's (E / 2) all-reduce over its replica on the other node, for 2 shards.
TEST(CrossNode, DataParallelOnTwoNodes) {
  const PlanRequest r = request(2);
  auto elems = [](const Prediction& p, int shard) { return p.memory.parameters / 4 * shard; };
  Prediction p = plan(r, dp(4, ZeroStage::None, 2));  // m = 1
  EXPECT_EQ(p.nodes_spanned, 2);
  double E = elems(p, 1);
  EXPECT_DOUBLE_EQ(p.across.data_parallel, 8 * E);
  EXPECT_DOUBLE_EQ(p.across.total(), 8 * E);
  p = plan(r, dp(4, ZeroStage::OptimizerState, 1));  // m = 2: still one reduction
  E = elems(p, 1);
  EXPECT_DOUBLE_EQ(p.across.total(), 6 * E + 4 * E);
  p = plan(r, dp(4, ZeroStage::Gradients, 1));
  E = elems(p, 1);
  EXPECT_DOUBLE_EQ(p.across.total(), 2 * 6 * E + 4 * E);
  p = plan(r, dp(4, ZeroStage::Parameters, 1));
  E = elems(p, 4);
  EXPECT_DOUBLE_EQ(p.across.total(), 2 * (6 * E + 2 * 4 * E));
  p = plan(r, dp(4, ZeroStage::Parameters, 1, Layout::kShardByHost));
  EXPECT_EQ(p.layout.zero_shard, 2);
  E = elems(p, 2);
  EXPECT_DOUBLE_EQ(p.across.total(), 2 * (2 * 4 * E / 2));
  EXPECT_DOUBLE_EQ(p.across.tensor_parallel + p.across.pipeline + p.across.expert_parallel, 0);
  // bf16 gradient reductions: partial sums still in fp32, results in bf16.
  PlanRequest b = r;
  b.engine_options.grad_comm_bytes = 2;
  p = plan(b, dp(4, ZeroStage::None, 2));
  E = elems(p, 1);
  EXPECT_DOUBLE_EQ(p.across.total(), 4 * E + 2 * E);
}

// 3 nodes x 2: the chain crosses twice and its result goes to two nodes. ZeRO-0: 4 x 4E. ZeRO-1:
// the reduce-scatter 2 x 4E + 4E x 4/6, the all-gather 2 x 4E. HSDP by host: 2 replica groups of
// 3 (one rank per node), each all-reducing a shard of E / 2 elements: 4 x 4E / 2.
TEST(CrossNode, DataParallelOnThreeNodes) {
  PlanRequest r = request(3);
  r.global_batch = 12;
  auto elems = [](const Prediction& p, int shard) { return p.memory.parameters / 4 * shard; };
  Prediction p = plan(r, dp(6, ZeroStage::None, 2));
  EXPECT_EQ(p.nodes_spanned, 3);
  double E = elems(p, 1);
  EXPECT_DOUBLE_EQ(p.across.total(), 16 * E);
  p = plan(r, dp(6, ZeroStage::OptimizerState, 2));
  E = elems(p, 1);
  EXPECT_NEAR(p.across.total(), 8 * E + 4 * E * 4 / 6 + 8 * E, 1e-6 * E);
  p = plan(r, dp(6, ZeroStage::Parameters, 2, Layout::kShardByHost));
  EXPECT_EQ(p.layout.zero_shard, 2);
  E = elems(p, 2);
  EXPECT_DOUBLE_EQ(p.across.total(), 2 * (4 * 4 * E / 2));
}

// The other groups on 2 nodes x 2: tensor parallelism inside a node crosses nothing and across
// nodes (tp = 4) all-reduces every activation collective's 4 B s C bytes across (2 + 4 L of them
// per micro-batch: the embedding's, two per block each way, the head's backward); a pipeline
// cut between the nodes sends each of the 2 ranks' activations (4 B s C) forward and their
// gradients back per micro-batch, and the tied embedding's gradients (V x C, padded) are
// all-reduced over the first and last stages; inside one node nothing crosses.
TEST(CrossNode, TensorAndPipelineParallel) {
  const PlanRequest r = request(2);
  const double C = r.model.hidden, s = r.model.seq, L = r.model.layers;
  Layout l;
  l.dp = 2;
  l.tp = 2;
  l.micro_batch = 2;  // m = 2
  Prediction p = plan(r, l);
  EXPECT_DOUBLE_EQ(p.across.tensor_parallel, 0);
  EXPECT_DOUBLE_EQ(p.across.data_parallel, 2 * 8 * p.memory.parameters / 4);  // 2 tp ranks' dp
  l = Layout{};
  l.tp = 4;
  l.micro_batch = 4;  // m = 2
  p = plan(r, l);
  EXPECT_DOUBLE_EQ(p.across.tensor_parallel, 2 * (2 + 4 * L) * 2 * (4 * 4 * s * C));
  EXPECT_DOUBLE_EQ(p.across.data_parallel, 0);
  l = Layout{};
  l.pp = 2;
  l.dp = 2;
  l.micro_batch = 2;  // m = 2
  p = plan(r, l);
  EXPECT_DOUBLE_EQ(p.across.pipeline, 2 * 2 * 2 * (4 * 2 * s * C));
  EXPECT_GE(p.across.data_parallel, 2 * 4 * r.model.vocab * C);  // the tied wte, both dp ranks
  EXPECT_LT(p.across.data_parallel, 2 * 4 * 1.1 * r.model.vocab * C);
  PlanRequest one = request(1);
  one.cluster.devices_per_node = 4;
  p = plan(one, dp(4, ZeroStage::Parameters, 1));
  EXPECT_EQ(p.nodes_spanned, 1);
  EXPECT_DOUBLE_EQ(p.across.total(), 0);
}

// Context parallelism across nodes is said to be left out rather than counted as nothing.
TEST(CrossNode, ContextParallelAcrossNodesIsNotModelled) {
  const PlanRequest r = request(2);
  Layout l;
  l.cp = 4;
  l.micro_batch = 8;
  Prediction p = plan(r, l);
  EXPECT_TRUE(p.across.cp_spans_nodes);
  EXPECT_TRUE(to_json(p, false)["bytes_across_nodes_per_step"]["context_parallel"].is_null());
  EXPECT_NE(format_prediction(r, p).find("context-parallel exchanges across nodes not modelled"),
            std::string::npos);
  l.cp = 2;
  l.dp = 2;
  l.micro_batch = 4;
  p = plan(r, l);
  EXPECT_FALSE(p.across.cp_spans_nodes);
}

TEST(CrossNode, ReportAndJson) {
  const PlanRequest r = request(2);
  const Prediction p = plan(r, dp(4, ZeroStage::OptimizerState, 1));
  const nlohmann::json j = to_json(p, false)["bytes_across_nodes_per_step"];
  EXPECT_EQ(j["nodes"], 2);
  EXPECT_DOUBLE_EQ(j["total"].get<double>(), p.across.total());
  EXPECT_DOUBLE_EQ(j["data_parallel"].get<double>(), p.across.data_parallel);
  EXPECT_EQ(j["context_parallel"], 0.0);
  const std::string text = format_prediction(r, p);
  EXPECT_NE(text.find("bytes between nodes per step (2 nodes summed, one process per node"),
            std::string::npos)
      << text;
  // One node: no line.
  PlanRequest one = request(1);
  one.cluster.devices_per_node = 4;
  EXPECT_EQ(format_prediction(one, plan(one, dp(4, ZeroStage::OptimizerState, 1)))
                .find("bytes between nodes"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::plan
