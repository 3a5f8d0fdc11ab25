// The work of one unit (the embedding, a block, the head) per micro-batch on one device of its
// tensor-parallel group: matmul FLOPs, memory traffic of the elementwise kernels, and the
// collectives it runs. Both engines count FLOPs the same way; they differ in element sizes, in
// how attention is computed and in what a full recomputation reruns (WorkRules).
//
// FLOPs per micro-batch of b sequences of s tokens, width C, t tensor-parallel ranks, on one of
// cp context-parallel ranks, which holds BT = b s / cp of the micro-batch's tokens (every
// token-wise FLOP and byte is / cp; the attention core's too: a rank's queries meet all s keys, and
// the head-tail chunks give every rank the same causal share, so it runs the one-rank core's
// FLOPs / cp):
//   block forward   24 BT C^2 / t (c_attn, attn c_proj, c_fc, mlp c_proj) + 4 b s^2 C f / t
//                   (Q K^T and P V; f = 1 dense, or the causal share tessera's blocked kernel
//                   computes), MoE MLPs: top_k x 16 BT C^2 / t x max(capacity factor, 1) + router
//   head forward    2 BT C V_local (the tied projection)
//   backward        2 x forward (input and weight gradients); the weight part W = the linear
//                   layers' forward FLOPs; a fused attention (tessera's) also reruns Q K^T:
//                   + 2 b s^2 C f / t (nn::BlockFlops::attention_core_recompute)
// Summed over a model, forward + backward + a full recomputation gives Narayanan et al. 2021's
// 96 B s l h^2 (1 + s / 6h + V / 16 l h) exactly without the fused attention's rerun (tested).
#pragma once

#include "tessera/nn/gpt_config.h"
#include "tessera/plan/gemm_efficiency.h"
#include "tessera/plan/layout.h"
#include "tessera/plan/model_spec.h"

namespace tessera::plan {

struct WorkRules {
  double act_bytes = 4;       // bytes of an activation element
  double score_bytes = 4;     // of an attention score / probability
  double logit_bytes = 4;     // of a logit (Megatron keeps them in fp32)
  bool causal_blocks = true;  // tessera computes only the causal tiles of 64 query rows
  // tessera's attention is fused (kernels/flash_attention.h): tiles of 64 queries against 64 keys,
  // the backward recomputing the probabilities (Q K^T again) from the log-sum-exp; the scores
  // never leave the cache, so only their softmax's arithmetic is counted (as bytes, untimed).
  bool fused_attention = false;
  // tessera's full recomputation skips the block's last projection (its output is not needed).
  bool recompute_skips_last_projection = true;
  int recompute_tp_collectives = 1;  // all-reduces a recomputed block forward runs
  // Megatron splits each expert's MLP over tp; tessera runs every expert whole on each tp rank.
  bool experts_split_over_tp = true;
  // An expert runs capacity rows (padded, GShard) or only the kept assignments (tessera: balanced
  // routing keeps min(1, capacity factor) of them).
  bool moe_pads_to_capacity = true;
  // When set (tessera on a cluster with a gemm_efficiency table): each GEMM is costed at its own
  // shape's efficiency (UnitWork's *_cost); otherwise the costs stay 0 and the planner divides
  // FLOPs by the one matmul_efficiency.
  const GemmEfficiencyCache* gemm = nullptr;
  // With gemm: the attention kernel at its measured rate, its softmax included (the elementwise
  // bytes then count only the probabilities' dropout).
  const AttentionEfficiency* attention = nullptr;
  // With gemm: the expert MLPs' cost of the busiest expert-parallel rank over balanced routing's.
  double moe_skew = 1;
};

struct UnitWork {
  double fwd_flops = 0, bwd_flops = 0, wgrad_flops = 0, recompute_flops = 0;
  // The same FLOPs, each GEMM's divided by its shape's efficiency (WorkRules::gemm): the FLOPs
  // the peak rate would take as long for. Seconds = cost / peak.
  double fwd_cost = 0, bwd_cost = 0, wgrad_cost = 0, recompute_cost = 0;
  double fwd_bytes = 0, bwd_bytes = 0, recompute_bytes = 0;
  int tp_fwd = 0, tp_bwd = 0, tp_recompute = 0;
  int a2a_fwd = 0, a2a_bwd = 0;
  double a2a_bytes = 0;
  // The attention core's share of the above (Q K^T and P V; its backward with the rerun), FLOPs
  // and costs, and the attention cores and MoE routers the unit runs (context parallelism's
  // exchanges, plan/context_parallel.h).
  double core_fwd_flops = 0, core_bwd_flops = 0, core_fwd_cost = 0, core_bwd_cost = 0;
  int attention_cores = 0, moe_routers = 0;
  UnitWork& operator+=(const UnitWork& o);
};

// The share of the dense T x T score matrix tessera's attention computes: tiles of
// kernels::kAttentionBlock (64) query rows against the keys up to the tile's end (the fused
// kernel's key tiles, 64 keys or at power-of-two head sizes above 64 a divisor of 64, end there
// too).
double causal_block_fraction(int T);

// Work of unit `unit` (0 embedding, 1..L blocks, L + 1 head) per micro-batch; of one half of a
// block where a pipeline stage boundary cuts it.
UnitWork unit_work(const ModelSpec& m, const Layout& l, int unit, const WorkRules& r,
                   nn::BlockPart part = nn::BlockPart::Whole);

// The tokens of a micro-batch one device holds: micro-batch x seq / cp.
double local_tokens(const ModelSpec& m, const Layout& l);

// Local vocabulary rows of tensor-parallel rank 0 (the largest shard): ceil(V / t).
int64_t vocab_local(int64_t vocab, int tp);

}  // namespace tessera::plan
