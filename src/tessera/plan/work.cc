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
  fwd_bytes += o.fwd_bytes;
  bwd_bytes += o.bwd_bytes;
  recompute_bytes += o.recompute_bytes;
  tp_fwd += o.tp_fwd;
  tp_bwd += o.tp_bwd;
  tp_recompute += o.tp_recompute;
  a2a_fwd += o.a2a_fwd;
  a2a_bwd += o.a2a_bwd;
  a2a_bytes = std::max(a2a_bytes, o.a2a_bytes);
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

int64_t vocab_local(int64_t vocab, int tp) {
  return (vocab + tp - 1) / tp;
}

namespace {

// One block's work, or one half's (the attention half: ln_1, c_attn, the core, c_proj and its
// residual branch; the MLP half: ln_2, the MLP or the experts, their residual branch).
UnitWork block_work(const ModelSpec& m, const Layout& l, int layer, const WorkRules& r,
                    nn::BlockPart part) {
  const double t = l.tp, C = m.hidden, s = m.seq, b = l.micro_batch, BT = b * s;
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
  const double mlp_linear = mlp ? k * BT * flops.mlp / mlp_t : 0;
  const double router = mlp ? BT * flops.router : 0;
  const double core = attn ? BT * flops.attention_core * causal / t : 0;  // Q K^T and P V
  const double linear = attn_linear + mlp_linear + router;
  w.fwd_flops = linear + core;
  w.bwd_flops = 2 * w.fwd_flops;
  w.wgrad_flops = linear;

  // Elementwise traffic per token: a LayerNorm and a residual branch (bias, dropout, add) per
  // half, the causal softmax (and the probabilities' dropout), GELU; MoE dispatch and combine.
  const double halves = (attn ? 1 : 0) + (mlp ? 1 : 0);
  const double branch = drop ? 7 * C * e + C : 3 * C * e;
  const double scores = heads_local * s * causal * r.score_bytes;
  const double softmax = attn ? 2 * scores * (drop ? 2 : 1) : 0;
  double per_token =
      halves * (2 * C * e + branch) * repl + (mlp ? k * 8 * C / mlp_t * e : 0) + softmax;
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
  const double C = m.hidden, BT = static_cast<double>(l.micro_batch) * m.seq, e = r.act_bytes;
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
  return w;
}

}  // namespace tessera::plan
