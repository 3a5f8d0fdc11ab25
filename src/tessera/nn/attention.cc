#include "tessera/nn/attention.h"

#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/attention.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/nn/kept_input.h"

namespace tessera::nn {

namespace k = tessera::kernels;

Attention::Attention(ParameterSet& ps, const GPTConfig& cfg, int layer, const TensorSplit& split,
                     const ContextSplit& context, Recompute recompute, bool bf16_gemm_inputs)
    : AttentionBranch(recompute, context), ps_(ps), cfg_(cfg), layer_(layer), split_(split) {
  const int t = split.size(), r = split.rank();
  const int64_t C = cfg.n_embd;
  TESSERA_CHECK_AS(ConfigError, cfg.n_head % t == 0, "the tensor-parallel size ", t,
                   " must divide the number of attention heads (", cfg.n_head, ")");
  heads_local_ = cfg.n_head / t;
  c_local_ = C / t;  // n_head divides C, t divides n_head
  const float proj_std = kInitStd / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  // c_attn by columns (the same columns of q, k and v: 3 blocks), c_proj by rows; ln_1 and the
  // c_proj bias replicated (ln_1's gradients are partial sums under sequence parallelism).
  auto part = [&](int dim, int64_t blocks, int64_t len) {
    return t == 1 ? ShardSpec{} : ShardSpec{dim, blocks, r * len, len};
  };
  const std::string h = "h." + std::to_string(layer) + ".";
  ln_w_ = ps.add(h + "ln_1.weight", {C}, Init::Ones, 0.0f, false);
  ln_b_ = ps.add(h + "ln_1.bias", {C}, Init::Zeros, 0.0f, false);
  c_attn_.weight = ps.add(h + "attn.c_attn.weight", {C, 3 * C}, Init::Normal, kInitStd, true,
                          part(1, 3, c_local_));
  c_attn_.bias =
      ps.add(h + "attn.c_attn.bias", {3 * C}, Init::Zeros, 0.0f, false, part(0, 3, c_local_));
  c_attn_.in = C, c_attn_.out = 3 * c_local_;
  c_proj_.weight =
      ps.add(h + "attn.c_proj.weight", {C, C}, Init::Normal, proj_std, true, part(0, 1, c_local_));
  c_proj_.bias = ps.add(h + "attn.c_proj.bias", {C}, Init::Zeros, 0.0f, false);
  c_proj_.in = c_local_, c_proj_.out = C;
  mark_sequence_partial(ps, ln_w_, split);
  mark_sequence_partial(ps, ln_b_, split);
  ps.mark_gemm_weight(c_attn_.weight);
  ps.mark_gemm_weight(c_proj_.weight);
  site_resid_drop_ = stable_hash(h + "attn.resid_dropout");
  core_.heads = k::AttentionHeads::multi_head(static_cast<int>(c_local_), heads_local_);
  core_.head_offset = r * heads_local_;
  core_.n_head = cfg.n_head;
  core_.drop_site = stable_hash(h + "attn.attn_dropout");
  core_.rows_per_sequence = context.rows_per_sequence(cfg.block_size);
  core_.bf16_gemm_inputs = bf16_gemm_inputs;
  core_.prefix = h;
  check_context_heads(context.comm, context.size(), core_.heads);  // Ulysses' rule
}

void Attention::allocate_rest(AttentionRecord& r, int max_batch, Allocator& alloc,
                              std::vector<NamedActivation>* list, DType gemm_inputs) const {
  const int64_t BT = max_batch * core_.rows_per_sequence;
  // The tensor-parallel region: every token, this rank's columns. The rest: this rank's rows.
  ActivationAllocator a(alloc, BT, list);
  ActivationAllocator rows(alloc, token_range(split_, BT).per, list, split_.sequence_parallel());
  const std::string h = "h." + std::to_string(layer_) + ".";
  const int64_t C = cfg_.n_embd;
  r.ln1 = rows(h + "ln_1", C, gemm_inputs);
  r.ln1_mean = rows(h + "ln_1.mean", 1);
  r.ln1_rstd = rows(h + "ln_1.rstd", 1);
  r.qkv = a(h + "qkv", 3 * c_local_);
  if (cfg_.dropout > 0.0f) r.mask = rows(h + "attn.resid_dropout.mask", C, DType::U8);
}

void Attention::run_forward(const BlockPass& mb, const float* x, float* y, AttentionRecord& r,
                            BlockWorkspace& ws) const {
  const int64_t C = cfg_.n_embd;
  const TpRegion tp = branch_region(split_, mb, ws, cfg_.n_embd);
  const int R = static_cast<int>(tp.rows.size());
  ps_.refresh_bf16_copy(c_attn_.weight);  // bf16 copies (refreshed here) or nothing
  ps_.refresh_bf16_copy(c_proj_.weight);
  // GEMM inputs the record may keep in bf16 are computed in the backward-only scratch first.
  float* ln1 = staging(r.ln1, ws.dln);
  k::layernorm_forward(ln1, r.ln1_mean.f32(), r.ln1_rstd.f32(), x, ps_.param_data(ln_w_),
                       ps_.param_data(ln_b_), R, static_cast<int>(C), cfg_.ln_eps);
  keep_rounded(r.ln1, ln1, R * C);
  column_linear(tp, ps_, c_attn_, r.qkv.f32(), ln1, kept(r.ln1));
  core_forward(mb, r.qkv.f32(), r.atty.f32(), r.lse.f32(), ws);
  const BranchDropout drop = branch_dropout(mb, tp, site_resid_drop_, r.mask);
  if (y == nullptr) {  // recomputing an attention half: the mask is what the backward needs
    drop.draw_mask(R, static_cast<int>(C));
    return;
  }
  row_linear(tp, ps_, c_proj_, y, kept(r.atty), x, drop);
}

std::shared_ptr<AttentionRecord::Deferred> Attention::make_deferred(int64_t tokens,
                                                                    Allocator* alloc) const {
  const int64_t C = cfg_.n_embd;
  auto d = std::make_shared<AttentionRecord::Deferred>();
  d->tokens = tokens;
  auto make = [&](int64_t width, const char* name) {
    return Tensor::zeros({tokens * width}, DType::F32, MemCategory::Activations, name, alloc);
  };
  d->d_proj = make(C, "block.deferred.d_attn_proj");
  d->d_attn = make(3 * c_local_, "block.deferred.d_qkv");
  // The record has no whole ln_1 under full recomputation or sequence parallelism.
  if (recompute_ == Recompute::Full || split_.sequence_parallel())
    d->ln1 = make(C, "block.deferred.ln_1");
  // Nor atty when recomputing (it lives in the workspace's scratch).
  if (recompute_ != Recompute::None) d->atty = make(c_local_, "block.deferred.atty");
  return d;
}

void Attention::run_backward(const BlockPass& mb, const float* x, const AttentionRecord& r,
                             float* dres, BlockWorkspace& ws,
                             AttentionRecord::Deferred* defer) const {
  const int BT = static_cast<int>(mb.tokens()), C = cfg_.n_embd;
  const int Cl = static_cast<int>(c_local_);
  const TpRegion tp = branch_region(split_, mb, ws, cfg_.n_embd);
  const int R = static_cast<int>(tp.rows.size());
  // Weight gradients now, or (zero-bubble BI) the output gradient kept for W.
  auto g = [&](int i) { return defer ? nullptr : ps_.grad_data(i); };
  auto keep = [&](Tensor& slot, const float* from, int64_t width) {
    if (defer && slot.defined())
      std::memcpy(slot.f32(), from, sizeof(float) * static_cast<size_t>(BT * width));
  };
  const float* dy =
      row_linear_grad_output(tp, dres, branch_dropout(mb, tp, site_resid_drop_, r.mask));
  if (defer) keep(defer->d_proj, dy, C);
  k::matmul_backward(ws.datty.f32(), g(c_proj_.weight), g(c_proj_.bias), dy, kept(r.atty),
                     ps_.gemm_weight(c_proj_.weight), BT, Cl, C);
  core_backward(mb, r, ws.datty.f32(), ws.dqkv.f32(), ws);
  if (defer) keep(defer->d_attn, ws.dqkv.f32(), 3 * Cl);
  const k::GemmInput ln1 = column_linear_input(tp, r.ln1);
  if (defer && defer->ln1.defined()) {
    TESSERA_ASSERT(ln1.f32 != nullptr, "a zero-bubble copy of a bf16-kept input");
    keep(defer->ln1, ln1.f32, C);
  }
  float* dln = ws.dln.f32();
  k::matmul_backward(dln, g(c_attn_.weight), g(c_attn_.bias), ws.dqkv.f32(), ln1,
                     ps_.gemm_weight(c_attn_.weight), BT, C, 3 * Cl);
  k::layernorm_backward(dres, ps_.grad_data(ln_w_), ps_.grad_data(ln_b_),
                        column_linear_grad_input(tp, dln), x, ps_.param_data(ln_w_),
                        r.ln1_mean.f32(), r.ln1_rstd.f32(), R, C);
}

void Attention::backward_weight(const BlockPass& mb, AttentionRecord& r) const {
  TESSERA_ASSERT(r.deferred != nullptr, "backward_weight of h.", layer_,
                 ".attn without a deferred backward");
  const AttentionRecord::Deferred& d = *r.deferred;
  const int BT = static_cast<int>(mb.tokens()), C = cfg_.n_embd, Cl = static_cast<int>(c_local_);
  // A matmul's input: the fp32 copy the BI pass kept, or the record's (fp32 or bf16).
  auto in = [](const Tensor& copy, const Tensor& rec) { return kept(copy.defined() ? copy : rec); };
  k::matmul_backward(nullptr, ps_.grad_data(c_proj_.weight), ps_.grad_data(c_proj_.bias),
                     d.d_proj.f32(), in(d.atty, r.atty), nullptr, BT, Cl, C);
  k::matmul_backward(nullptr, ps_.grad_data(c_attn_.weight), ps_.grad_data(c_attn_.bias),
                     d.d_attn.f32(), in(d.ln1, r.ln1), nullptr, BT, C, 3 * Cl);
}

void Attention::decode(const DecodeStep& step, const float* x, float* y, KvLayer& kv,
                       DecodeScratch& s, BlockWorkspace& ws) const {
  TESSERA_ASSERT(split_.size() == 1, "h.", layer_, ".attn: decode without tensor parallelism only");
  const int n = step.n;
  const int64_t C = cfg_.n_embd, W = 3 * C;
  ps_.refresh_bf16_copy(c_attn_.weight);
  ps_.refresh_bf16_copy(c_proj_.weight);
  float* ln1 = s.norm.f32();
  k::layernorm_forward(ln1, s.mean.f32(), s.rstd.f32(), x, ps_.param_data(ln_w_),
                       ps_.param_data(ln_b_), n, static_cast<int>(C), cfg_.ln_eps);
  float* qkv = s.qkv.f32();
  linear_forward(ps_, c_attn_, qkv, W, ln1, n);
  // The new keys and values at their positions, then the attention over all of them.
  const size_t row = sizeof(float) * static_cast<size_t>(C);
  for (int i = 0; i < n; ++i) {
    std::memcpy(kv.k.f32() + (step.pos0 + i) * C, qkv + i * W + C, row);
    std::memcpy(kv.v.f32() + (step.pos0 + i) * C, qkv + i * W + 2 * C, row);
  }
  k::attention_decode(s.atty.f32(), qkv, W, kv.k.f32(), kv.v.f32(), C, n, step.pos0,
                      k::AttentionHeads::multi_head(static_cast<int>(C), cfg_.n_head),
                      s.scores.f32());
  const TpRegion tp(split_, n, C, nullptr, ws.proj.f32());
  row_linear(tp, ps_, c_proj_, y, s.atty.f32(), x, BranchDropout{});
}

}  // namespace tessera::nn
