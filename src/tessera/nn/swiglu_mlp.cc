#include "tessera/nn/swiglu_mlp.h"

#include <cstring>

#include "tessera/core/error.h"
#include "tessera/kernels/rmsnorm.h"
#include "tessera/kernels/swiglu.h"
#include "tessera/nn/kept_input.h"

namespace tessera::nn {

namespace k = tessera::kernels;

SwigluMlp::SwigluMlp(ParameterSet& ps, const GPTConfig& cfg, int layer, const TensorSplit& split,
                     const ContextSplit& context, Recompute recompute, bool bf16_gemm_inputs)
    : ps_(ps),
      cfg_(cfg),
      layer_(layer),
      split_(split),
      recompute_(recompute),
      bf16_gemm_inputs_(bf16_gemm_inputs),
      rows_per_sequence_(context.rows_per_sequence(cfg.block_size)) {
  const int t = split.size(), r = split.rank();
  const int64_t C = cfg.n_embd, F = cfg.mlp_hidden();
  TESSERA_CHECK_AS(ConfigError, F % t == 0, "the tensor-parallel size ", t,
                   " must divide the MLP width ", F, " (ffn_dim)");
  hidden_local_ = F / t;
  const int64_t Fl = hidden_local_;
  const std::string h = "model.layers." + std::to_string(layer) + ".";
  norm_ = ps.add(h + "post_attention_layernorm.weight", {C}, Init::Ones, 0.0f, false);
  auto column = [&](Linear& l, const char* name) {
    l.weight = ps.add(h + "mlp." + name + ".weight", {F, C}, Init::Normal, kInitStd, true,
                      t == 1 ? ShardSpec{} : ShardSpec{0, 1, r * Fl, Fl});
    l.in = C, l.out = Fl, l.transposed = true;
    ps.mark_gemm_weight(l.weight);
  };
  column(gate_, "gate_proj");
  column(up_, "up_proj");
  down_.weight = ps.add(h + "mlp.down_proj.weight", {C, F}, Init::Normal, kInitStd, true,
                        t == 1 ? ShardSpec{} : ShardSpec{1, 1, r * Fl, Fl});
  down_.in = Fl, down_.out = C, down_.transposed = true;
  ps.mark_gemm_weight(down_.weight);
  mark_sequence_partial(ps, norm_, split);
}

void SwigluMlp::allocate(SwigluMlpRecord& r, int max_batch, Allocator& alloc,
                         std::vector<NamedActivation>* list, DType gemm_inputs) const {
  const int64_t BT = max_batch * rows_per_sequence_, C = cfg_.n_embd;
  ActivationAllocator a(alloc, BT, list);
  ActivationAllocator rows(alloc, token_range(split_, BT).per, list, split_.sequence_parallel());
  const std::string h = "model.layers." + std::to_string(layer_) + ".";
  r.ln2 = rows(h + "post_attention_layernorm", C, gemm_inputs);
  r.ln2_rstd = rows(h + "post_attention_layernorm.rstd", 1);
  r.gu = a(h + "mlp.gate_up", 2 * hidden_local_);
  r.h = a(h + "mlp.swiglu", hidden_local_, gemm_inputs);
}

std::unique_ptr<MlpRecord> SwigluMlp::make_record(int max_batch, Allocator& alloc,
                                                  std::vector<NamedActivation>* list) const {
  auto r = std::make_unique<SwigluMlpRecord>();
  if (recompute_ != Recompute::Full)
    allocate(*r, max_batch, alloc, list, bf16_gemm_inputs_ ? DType::BF16 : DType::F32);
  return r;
}

void SwigluMlp::reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const {
  // recomputed activations are fp32
  reserve_mlp_record<SwigluMlpRecord>(ws, kind(), recompute_, [&](SwigluMlpRecord& r) {
    allocate(r, max_batch, alloc, nullptr, DType::F32);
  });
}

SwigluMlpRecord& SwigluMlp::scratch(BlockWorkspace& ws) const {
  return reserved_mlp_record<SwigluMlpRecord>(ws, kind(), layer_);
}

void SwigluMlp::run_forward(const BlockPass& mb, const float* x, float* y, SwigluMlpRecord& r,
                            BlockWorkspace& ws) const {
  const int64_t BT = mb.tokens(), C = cfg_.n_embd, F = hidden_local_;
  const TpRegion tp = branch_region(split_, mb, ws, C);
  const int64_t R = tp.rows.size();
  for (const Linear* l : {&gate_, &up_, &down_}) ps_.refresh_bf16_copy(l->weight);
  float* n = staging(r.ln2, ws.dln);
  k::rmsnorm_forward(n, r.ln2_rstd.f32(), x, ps_.param_data(norm_), R, C, cfg_.ln_eps);
  keep_rounded(r.ln2, n, R * C);
  const k::GemmInput in = enter_tp(tp, n, kept(r.ln2));  // gathered once for gate and up
  float* gu = r.gu.f32();
  if (const auto f = fused(ps_, {&gate_, &up_})) {  // one GEMM when the weights are adjacent
    linear_forward(ps_, *f, gu, 2 * F, in, BT);
  } else {
    linear_forward(ps_, gate_, gu, 2 * F, in, BT);
    linear_forward(ps_, up_, gu + F, 2 * F, in, BT);
  }
  float* h = staging(r.h, ws.dfch);
  k::swiglu_forward(h, gu, gu + F, BT, F, 2 * F);
  keep_rounded(r.h, h, BT * F);
  if (y == nullptr) return;  // a recomputation: the backward has what it needs
  row_linear(tp, ps_, down_, y, kept(r.h), x, BranchDropout{});
}

void SwigluMlp::forward(const BlockPass& mb, const float* x, float* y, MlpRecord& r,
                        BlockWorkspace& ws) const {
  run_forward(mb, x, y,
              recompute_ == Recompute::Full ? scratch(ws) : static_cast<SwigluMlpRecord&>(r), ws);
}

void SwigluMlp::recompute(const BlockPass& mb, const float* x, BlockWorkspace& ws) const {
  run_forward(mb, x, nullptr, scratch(ws), ws);
}

size_t SwigluMlp::deferred_bytes(int64_t tokens) const {
  return allocated_bytes([&](Allocator* a) { return make_deferred(tokens, a); });
}

std::shared_ptr<SwigluMlpRecord::Deferred> SwigluMlp::make_deferred(int64_t tokens,
                                                                    Allocator* alloc) const {
  const int64_t C = cfg_.n_embd;
  auto d = std::make_shared<SwigluMlpRecord::Deferred>();
  d->tokens = tokens;
  auto make = [&](int64_t width, const char* name) {
    return Tensor::zeros({tokens * width}, DType::F32, MemCategory::Activations, name, alloc);
  };
  d->d_down = make(C, "block.deferred.d_down");
  d->d_gu = make(2 * hidden_local_, "block.deferred.d_gate_up");
  if (recompute_ == Recompute::Full || split_.sequence_parallel())
    d->ln2 = make(C, "block.deferred.post_attention_layernorm");
  if (recompute_ == Recompute::Full) d->h = make(hidden_local_, "block.deferred.swiglu");
  return d;
}

SwigluMlpRecord::Deferred& SwigluMlp::deferred_for(const BlockPass& mb, SwigluMlpRecord& r) const {
  return nn::deferred_for(r, mb.tokens(), [&](int64_t n) { return make_deferred(n, nullptr); });
}

void SwigluMlp::backward(const BlockPass& mb, const float* x, MlpRecord& record, float* dres,
                         BlockWorkspace& ws, bool defer) const {
  SwigluMlpRecord& r = static_cast<SwigluMlpRecord&>(record);
  SwigluMlpRecord::Deferred* d = defer ? &deferred_for(mb, r) : nullptr;
  if (recompute_ != Recompute::Full) {
    run_backward(mb, x, r, dres, ws, d);
    return;
  }
  SwigluMlpRecord& full = scratch(ws);  // recomputed by the block
  run_backward(mb, x, full, dres, ws, d);
  if (d)  // W needs h, which lives in the shared scratch (the norm's output: run_backward kept it)
    std::memcpy(d->h.f32(), full.h.f32(),
                sizeof(float) * static_cast<size_t>(mb.tokens() * hidden_local_));
}

void SwigluMlp::run_backward(const BlockPass& mb, const float* x, SwigluMlpRecord& r, float* dres,
                             BlockWorkspace& ws, SwigluMlpRecord::Deferred* defer) const {
  const int64_t BT = mb.tokens(), C = cfg_.n_embd, F = hidden_local_;
  const TpRegion tp = branch_region(split_, mb, ws, C);
  const int64_t R = tp.rows.size();
  auto g = [&](int i) { return defer ? nullptr : ps_.grad_data(i); };
  auto keep = [&](Tensor& slot, const float* from, int64_t width) {
    if (defer && slot.defined())
      std::memcpy(slot.f32(), from, sizeof(float) * static_cast<size_t>(BT * width));
  };
  const float* dy = row_linear_grad_output(tp, dres, BranchDropout{});
  if (defer) keep(defer->d_down, dy, C);
  float* dh = ws.dfch.f32();
  linear_backward(ps_, down_, dh, false, g(down_.weight), nullptr, dy, C, kept(r.h), BT);
  float* gu = r.gu.f32();  // becomes d(gate) | d(up), in place
  k::swiglu_backward(gu, gu + F, dh, gu, gu + F, BT, F, 2 * F);
  if (defer) keep(defer->d_gu, gu, 2 * F);
  const k::GemmInput in = column_linear_input(tp, r.ln2);
  if (defer && defer->ln2.defined()) {
    TESSERA_ASSERT(in.f32 != nullptr, "a zero-bubble copy of a bf16-kept input");
    keep(defer->ln2, in.f32, C);
  }
  float* dn = ws.dln.f32();
  if (const auto f = fused(ps_, {&gate_, &up_})) {
    linear_backward(ps_, *f, dn, false, g(f->weight), nullptr, gu, 2 * F, in, BT);
  } else {
    linear_backward(ps_, gate_, dn, false, g(gate_.weight), nullptr, gu, 2 * F, in, BT);
    linear_backward(ps_, up_, dn, true, g(up_.weight), nullptr, gu + F, 2 * F, in, BT);
  }
  k::rmsnorm_backward(dres, ps_.grad_data(norm_), column_linear_grad_input(tp, dn), x,
                      ps_.param_data(norm_), r.ln2_rstd.f32(), R, C);
}

void SwigluMlp::backward_weight(const BlockPass& mb, MlpRecord& record) const {
  SwigluMlpRecord& r = static_cast<SwigluMlpRecord&>(record);
  TESSERA_ASSERT(r.deferred != nullptr, "backward_weight of layer ", layer_,
                 "'s MLP without a deferred backward");
  const SwigluMlpRecord::Deferred& d = *r.deferred;
  const int64_t BT = mb.tokens(), C = cfg_.n_embd, F = hidden_local_;
  auto in = [](const Tensor& copy, const Tensor& rec) { return kept(copy.defined() ? copy : rec); };
  linear_backward(ps_, down_, nullptr, false, ps_.grad_data(down_.weight), nullptr, d.d_down.f32(),
                  C, in(d.h, r.h), BT);
  const k::GemmInput n = in(d.ln2, r.ln2);
  if (const auto f = fused(ps_, {&gate_, &up_})) {
    linear_backward(ps_, *f, nullptr, false, ps_.grad_data(f->weight), nullptr, d.d_gu.f32(), 2 * F,
                    n, BT);
    return;
  }
  linear_backward(ps_, gate_, nullptr, false, ps_.grad_data(gate_.weight), nullptr, d.d_gu.f32(),
                  2 * F, n, BT);
  linear_backward(ps_, up_, nullptr, false, ps_.grad_data(up_.weight), nullptr, d.d_gu.f32() + F,
                  2 * F, n, BT);
}

}  // namespace tessera::nn
