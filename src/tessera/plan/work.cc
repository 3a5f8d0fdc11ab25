#include "tessera/plan/work.h"

#include <algorithm>

#include "tessera/kernels/attention.h"
#include "tessera/nn/gpt_costs.h"

namespace tessera::plan {

UnitWork& UnitWork::operator+=(const UnitWork& o) {
  fwd_flops += o.fwd_flops;
  bwd_flops += o.bwd_flops;
  wgrad_flops += o.wgrad_flops;
  recompute_flops += o.recompute_flops;
  fwd_cost += o.fwd_cost;
  bwd_cost += o.bwd_cost;
  wgrad_cost += o.wgrad_cost;
  recompute_cost += o.recompute_cost;
  fwd_bytes += o.fwd_bytes;
  bwd_bytes += o.bwd_bytes;
  recompute_bytes += o.recompute_bytes;
  tp_fwd += o.tp_fwd;
  tp_bwd += o.tp_bwd;
  tp_recompute += o.tp_recompute;
  a2a_fwd += o.a2a_fwd;
  a2a_bwd += o.a2a_bwd;
  a2a_bytes = std::max(a2a_bytes, o.a2a_bytes);
  core_fwd_flops += o.core_fwd_flops;
  core_bwd_flops += o.core_bwd_flops;
  core_fwd_cost += o.core_fwd_cost;
  core_bwd_cost += o.core_bwd_cost;
  attention_cores += o.attention_cores;
  moe_routers += o.moe_routers;
  return *this;
}

double causal_block_fraction(int T) {
  const int blk = kernels::kAttentionBlock;
  double computed = 0;
  for (int r0 = 0; r0 < T; r0 += blk) {
    const int r1 = std::min(T, r0 + blk);
    computed += static_cast<double>(r1 - r0) * r1;
  }
  return computed / (static_cast<double>(T) * T);
}

double local_tokens(const ModelSpec& m, const Layout& l) {
  return static_cast<double>(l.micro_batch) * m.seq / l.cp;
}

int64_t vocab_local(int64_t vocab, int tp) {
  return (vocab + tp - 1) / tp;
}

namespace {

// Peak-equivalent FLOPs of one part of the work: forward, the whole backward, its W share.
struct Cost {
  double fwd = 0, bwd = 0, wgrad = 0;
  Cost& operator+=(const Cost& o) {
    fwd += o.fwd, bwd += o.bwd, wgrad += o.wgrad;
    return *this;
  }
};

// A linear layer of `flops` forward over `rows` rows, `in` -> `out` features: the forward
// [rows, in] x [in, out], the input gradient [rows, out] x [out, in], the weight gradient
// [in, rows] x [rows, out], each as many FLOPs.
Cost linear_cost(const GemmEfficiencyCache& eff, double flops, double rows, double in, double out) {
  if (flops <= 0) return {};
  const double w = flops / eff(in, out, rows);
  return {flops / eff(rows, out, in), flops / eff(rows, in, out) + w, w};
}

// The per-head attention GEMMs over `flops` (forward, Q K^T and P V) and `bwd_flops` (backward).
// Fused (kernels/flash_attention.cc): tiles of b = 64 queries against 64 keys, forward S = Q K^T
// [b, hs] x [hs, b] and O += P V [b, b] x [b, hs]; backward S again, dP = dO V^T (as S), dV += P^T
// dO and dK += dS^T Q ([b, b] x [b, hs]), dQ += dS K (as P V). Materialising
// (kernels/attention.cc): for each block of rb query rows ending at r1, S = Q K^T [rb, hs] x [hs,
// r1] and O = P V [rb, r1] x [r1, hs]; backward dP [rb, r1] (K = hs), dV and dK [r1, hs] (K = rb),
// dQ [rb, hs] (K = r1). Blocks weigh by their FLOPs (rb r1).
Cost attention_cost(const GemmEfficiencyCache& eff, const AttentionEfficiency* kernel, double flops,
                    double bwd_flops, int T, int hs, bool blocks, bool fused) {
  if (flops <= 0) return {};
  if (kernel != nullptr)
    return {flops / kernel->at(false, T, hs), bwd_flops / kernel->at(true, T, hs), 0};
  if (fused) {
    const double b = kernels::kAttentionBlock, s = 1 / eff(b, b, hs), o = 1 / eff(b, hs, b);
    return {flops * (s + o) / 2, bwd_flops * (2 * s + 3 * o) / 5, 0};
  }
  const int blk = blocks ? kernels::kAttentionBlock : T;
  double total = 0, fwd_inv = 0, bwd_inv = 0;
  for (int r0 = 0; r0 < T; r0 += blk) {
    const double r1 = std::min(T, r0 + blk), rb = r1 - r0, w = rb * r1;
    total += w;
    fwd_inv += w * (1 / eff(rb, r1, hs) + 1 / eff(rb, hs, r1)) / 2;
    bwd_inv += w * (1 / eff(rb, r1, hs) + 2 / eff(r1, hs, rb) + 1 / eff(rb, hs, r1)) / 4;
  }
  return {flops * fwd_inv / total, bwd_flops * bwd_inv / total, 0};
}

// What block_work counted, for its costs.
struct BlockFlopParts {
  double qkv = 0, attn_proj = 0, mlp_linear = 0, router = 0, core = 0, core_bwd = 0;
};

// Costs of a block's (or half's) GEMMs at their shapes; `last` the forward cost of the
// projection a full recomputation skips.
UnitWork block_costs(const ModelSpec& m, const Layout& l, bool moe, const WorkRules& r,
                     const BlockFlopParts& f, bool mlp_half, double k, double mlp_t) {
  const GemmEfficiencyCache& eff = *r.gemm;
  const double t = l.tp, C = m.hidden, BT = local_tokens(m, l);
  // An MoE block's experts each run their share of the routed rows (balanced routing).
  const double ep = l.ep, E = moe ? m.moe.experts : 1;
  const double rows = moe ? std::max(1.0, k * BT * ep / E) : BT;
  const Cost attn_proj = linear_cost(eff, f.attn_proj, BT, C / t, C);
  // The busiest rank's experts run moe_skew x the balanced rows (at the balanced shapes).
  const double experts = moe && l.ep > 1 ? r.moe_skew : 1.0;
  // The MLP's matmuls into its hidden width (GELU's c_fc; SwiGLU's gate and up: 2/3 of the
  // FLOPs) and out of it.
  const double F = static_cast<double>(moe ? to_gpt_config(m).moe_hidden() : m.ffn());
  const double into = m.arch == nn::Arch::Llama ? 2.0 / 3.0 : 0.5;
  const Cost fc = linear_cost(eff, experts * f.mlp_linear * into, rows, C, F / mlp_t);
  const Cost proj = linear_cost(eff, experts * f.mlp_linear * (1 - into), rows, F / mlp_t, C);
  Cost c = linear_cost(eff, f.qkv, BT, C, static_cast<double>(m.qkv()) / t);
  c += attn_proj;
  c += fc;
  c += proj;
  c += linear_cost(eff, f.router, BT, C, moe ? m.moe.experts : 1);
  const int hs = m.hidden / m.heads;
  const Cost core = attention_cost(eff, r.attention, f.core, f.core_bwd, m.seq, hs, r.causal_blocks,
                                   r.fused_attention);
  c += core;
  UnitWork w;
  w.fwd_cost = c.fwd;
  w.bwd_cost = c.bwd;
  w.wgrad_cost = c.wgrad;
  w.core_fwd_cost = core.fwd;
  w.core_bwd_cost = core.bwd;
  if (l.recompute == nn::Recompute::Selective) {
    w.recompute_cost = core.fwd;
  } else if (l.recompute == nn::Recompute::Full) {
    const double last = mlp_half ? proj.fwd : attn_proj.fwd;
    w.recompute_cost = c.fwd - (r.recompute_skips_last_projection ? last : 0);
  }
  return w;
}

// One block's work, or one half's (the attention half: ln_1, c_attn, the core, c_proj and its
// residual branch; the MLP half: ln_2, the MLP or the experts, their residual branch).
UnitWork block_work(const ModelSpec& m, const Layout& l, int layer, const WorkRules& r,
                    nn::BlockPart part) {
  const double t = l.tp, C = m.hidden, s = m.seq, BT = local_tokens(m, l);
  const double heads_local = m.heads / t;
  const double causal = r.causal_blocks ? causal_block_fraction(m.seq) : 1.0;
  const bool moe = m.moe.is_moe_layer(layer);
  const double f = m.moe.capacity_factor;
  const double cap = f <= 0 ? 1.0 : r.moe_pads_to_capacity ? std::max(1.0, f) : std::min(1.0, f);
  const double k = moe ? m.moe.top_k * cap : 1.0;  // MLP passes per token
  const bool drop = m.dropout > 0;
  const double e = r.act_bytes;
  const double repl = l.sp ? 1.0 / t : 1.0;  // sequence parallelism splits the replicated parts
  const bool attn = part != nn::BlockPart::Mlp, mlp = part != nn::BlockPart::Attention;

  UnitWork w;
  // The model's FLOPs per token (nn/gpt_costs.h), split over tp, times the micro-batch's tokens.
  const nn::BlockFlops flops = nn::block_flops(to_gpt_config(m), layer, m.seq);
  const double attn_proj = BT * flops.attention_out / t;
  const double attn_linear = attn ? BT * flops.qkv / t + attn_proj : 0;
  const double mlp_t = moe && !r.experts_split_over_tp ? 1.0 : t;  // the MLP's tp split
  // Routed passes at the expert tp split, plus a shared expert split like a dense MLP.
  const double mlp_linear = mlp ? k * BT * flops.mlp / mlp_t + BT * flops.shared_expert / t : 0;
  const double router = mlp ? BT * flops.router : 0;
  const double core = attn ? BT * flops.attention_core * causal / t : 0;  // Q K^T and P V
  // The fused backward's Q K^T again (nn::BlockFlops::attention_core_recompute).
  const double rerun =
      attn && r.fused_attention ? BT * flops.attention_core_recompute * causal / t : 0;
  const double linear = attn_linear + mlp_linear + router;
  w.fwd_flops = linear + core;
  w.bwd_flops = 2 * w.fwd_flops + rerun;
  w.wgrad_flops = linear;
  w.core_fwd_flops = core;
  w.core_bwd_flops = 2 * core + rerun;
  w.attention_cores = attn ? 1 : 0;
  w.moe_routers = moe && mlp ? 1 : 0;

  // Elementwise traffic per token: a LayerNorm and a residual branch (bias, dropout, add) per
  // half, the causal softmax (and the probabilities' dropout), GELU; MoE dispatch and combine.
  const double halves = (attn ? 1 : 0) + (mlp ? 1 : 0);
  const double branch = drop ? 7 * C * e + C : 3 * C * e;
  const double scores = heads_local * s * causal * r.score_bytes;
  // The softmax pass (and the dropout's), less what a measured attention kernel includes: the
  // softmax, and a fused kernel's dropout too.
  const bool timed = r.gemm != nullptr && r.attention != nullptr;
  const double passes = timed ? (r.fused_attention || !drop ? 0 : 1) : (drop ? 2 : 1);
  const double softmax = attn ? 2 * scores * passes : 0;
  // The activation between the MLP's matmuls: GELU reads and writes F = 4C; SwiGLU reads gate and
  // up and writes their product.
  const double act = (m.arch == nn::Arch::Llama ? 3.0 : 2.0) * static_cast<double>(m.ffn());
  double per_token =
      halves * (2 * C * e + branch) * repl + (mlp ? k * act / mlp_t * e : 0) + softmax;
  if (moe && mlp) per_token += 2 * m.moe.top_k * C * e + 2 * m.moe.experts * 4.0;
  w.fwd_bytes = BT * per_token;
  w.bwd_bytes = 2 * w.fwd_bytes;

  if (l.recompute == nn::Recompute::Selective) {
    w.recompute_flops = core;
    w.recompute_bytes = BT * softmax;
  } else if (l.recompute == nn::Recompute::Full) {
    // The recomputation skips the last projection of what the unit holds: the MLP's, or the
    // attention's for an attention half.
    const double last = mlp ? mlp_linear / 2 : attn_proj;
    w.recompute_flops = w.fwd_flops - (r.recompute_skips_last_projection ? last : 0);
    w.recompute_bytes = w.fwd_bytes;
  }
  if (r.gemm != nullptr) {
    const BlockFlopParts parts{attn ? BT * flops.qkv / t : 0,
                               attn ? attn_proj : 0,
                               mlp_linear,
                               router,
                               core,
                               2 * core + rerun};
    const UnitWork c = block_costs(m, l, moe, r, parts, mlp, k, mlp_t);
    w.fwd_cost = c.fwd_cost;
    w.bwd_cost = c.bwd_cost;
    w.wgrad_cost = c.wgrad_cost;
    w.recompute_cost = c.recompute_cost;
    w.core_fwd_cost = c.core_fwd_cost;
    w.core_bwd_cost = c.core_bwd_cost;
  }
  if (l.tp > 1) {
    // An MoE half whose experts are whole on every tp rank needs no tp collective (under sp an
    // all-gather each way, counted like the dense half's pair).
    const bool mlp_tp = mlp && !(moe && !r.experts_split_over_tp && !l.sp);
    const int tp_halves = (attn ? 1 : 0) + (mlp_tp ? 1 : 0);
    w.tp_fwd = tp_halves;
    w.tp_bwd = tp_halves;
    // A whole block's count; the halves split it, the skipped projection's collective dropped.
    if (l.recompute == nn::Recompute::Full)
      w.tp_recompute = part == nn::BlockPart::Whole ? r.recompute_tp_collectives
                                                    : r.recompute_tp_collectives / 2;
  }
  if (moe && mlp && l.ep > 1) {
    w.a2a_fwd = 2;  // dispatch, combine
    w.a2a_bwd = 2 + (l.recompute == nn::Recompute::Full ? 2 : 0);
    w.a2a_bytes = m.moe.top_k * cap * BT * C * e;
  }
  return w;
}

}  // namespace

UnitWork unit_work(const ModelSpec& m, const Layout& l, int unit, const WorkRules& r,
                   nn::BlockPart part) {
  const double C = m.hidden, BT = local_tokens(m, l), e = r.act_bytes;
  UnitWork w;
  if (unit == 0) {  // a gather forward, a scatter-add backward
    w.fwd_bytes = BT * 3 * C * e;
    w.bwd_bytes = BT * 3 * C * e;
    w.tp_fwd = l.tp > 1 ? 1 : 0;
    return w;
  }
  if (unit <= m.layers) return block_work(m, l, unit - 1, r, part);
  const double V = static_cast<double>(vocab_local(m.vocab, l.tp));
  w.fwd_flops = BT * (nn::head_flops(to_gpt_config(m)) / m.vocab * V);  // its vocabulary rows
  w.bwd_flops = 2 * w.fwd_flops;
  w.wgrad_flops = w.fwd_flops;
  w.fwd_bytes = BT * (2 * C * e + V * r.logit_bytes);
  w.bwd_bytes = BT * (4 * C * e + 2 * V * r.logit_bytes);
  w.tp_bwd = l.tp > 1 ? 1 : 0;
  if (r.gemm != nullptr) {
    const Cost c = linear_cost(*r.gemm, w.fwd_flops, BT, C, V);
    w.fwd_cost = c.fwd;
    w.bwd_cost = c.bwd;
    w.wgrad_cost = c.wgrad;
  }
  return w;
}

}  // namespace tessera::plan
