// Routing imbalance (EngineOptions::moe_skew, `tessera plan --moe-skew`): the busiest
// expert-parallel rank's routed rows and expert MLP time grow with the skew; one rank, which runs
// every expert, does not change; balanced routing plans exactly as before.
#include <gtest/gtest.h>

#include "tessera/core/error.h"
#include "tessera/plan/planner.h"

namespace tessera::plan {
namespace {

PlanRequest moe_request(double skew) {
  PlanRequest r;
  r.model.layers = 2;
  r.model.hidden = 64;
  r.model.heads = 4;
  r.model.seq = 32;
  r.model.vocab = 128;
  r.model.moe.experts = 4;
  r.model.moe.top_k = 2;
  r.cluster = load_cluster("dev-vm");
  r.global_batch = 8;
  r.oversubscribe = true;
  r.engine_options.moe_skew = skew;
  return r;
}

Layout expert_parallel(int ep) {
  Layout l;
  l.dp = 2;
  l.ep = ep;
  l.micro_batch = 4;
  return l;
}

TEST(MoeSkew, TheBusiestRanksRowsAndExpertTimeGrow) {
  const Prediction balanced = plan_layout(moe_request(1.0), expert_parallel(2));
  const Prediction skewed = plan_layout(moe_request(1.5), expert_parallel(2));
  ASSERT_TRUE(balanced.ok() && skewed.ok());
  EXPECT_GT(skewed.memory.activations, balanced.memory.activations);
  EXPECT_EQ(skewed.memory.model_states(), balanced.memory.model_states());
  EXPECT_GT(skewed.step_seconds, balanced.step_seconds);
  // FLOPs are balanced routing's: MFU's numerator does not change.
  EXPECT_EQ(skewed.model_flops_per_step, balanced.model_flops_per_step);
  EXPECT_EQ(skewed.hardware_flops_per_step, balanced.hardware_flops_per_step);
}

TEST(MoeSkew, OneExpertParallelRankRunsEveryRowWhateverTheRouting) {
  const Prediction balanced = plan_layout(moe_request(1.0), expert_parallel(1));
  const Prediction skewed = plan_layout(moe_request(2.0), expert_parallel(1));
  EXPECT_EQ(skewed.memory.total(), balanced.memory.total());
  EXPECT_NEAR(skewed.step_seconds, balanced.step_seconds, 1e-9 * balanced.step_seconds);
}

// The all-to-alls' bytes: each rank routes its rows (batch 8 / dp 2 = 4 sequences of 32 tokens,
// top-2) of 64 floats, and sends the half bound for the other expert-parallel rank, in a dispatch
// and a combine forward and again backward, in each of the 2 MoE layers (as the run's
// ep_bytes_per_rank counts them; docs/guide/06-experts.md checks one against a run).
TEST(MoeSkew, ExpertBytesAreTheRowsSentToOtherRanks) {
  const Prediction p = plan_layout(moe_request(1.0), expert_parallel(2));
  ASSERT_TRUE(p.ok());
  const double rows = 4 * 32 * 2, row_bytes = 64 * 4;
  EXPECT_DOUBLE_EQ(p.ep_bytes, rows * row_bytes / 2 * 4 * 2);
  EXPECT_EQ(plan_layout(moe_request(1.0), expert_parallel(1)).ep_bytes, 0);
}

TEST(MoeSkew, BelowBalancedIsAConfigError) {
  EXPECT_THROW(plan_layout(moe_request(0.5), expert_parallel(2)), ConfigError);
}

}  // namespace
}  // namespace tessera::plan
