#include "tessera/nn/gelu_mlp.h"

#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/nn/kept_input.h"

namespace tessera::nn {

namespace k = tessera::kernels;

GeluMlp::GeluMlp(ParameterSet& ps, const GPTConfig& cfg, int layer, const TensorSplit& split,
                 const ContextSplit& context, Recompute recompute, bool bf16_gemm_inputs)
    : ps_(ps),
      cfg_(cfg),
      layer_(layer),
      split_(split),
      recompute_(recompute),
      bf16_gemm_inputs_(bf16_gemm_inputs),
      rows_per_sequence_(context.rows_per_sequence(cfg.block_size)) {
  const int t = split.size(), r = split.rank();
  const int64_t C = cfg.n_embd;
  TESSERA_CHECK_AS(ConfigError, (4 * C) % t == 0, "the tensor-parallel size ", t,
                   " must divide the MLP width 4 x ", C);
  hidden_local_ = 4 * C / t;
  const float proj_std = kInitStd / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  // c_fc by columns, c_proj by rows; ln_2 and the c_proj bias replicated.
  auto part = [&](int dim, int64_t len) {
    return t == 1 ? ShardSpec{} : ShardSpec{dim, 1, r * len, len};
  };
  const std::string h = "h." + std::to_string(layer) + ".";
  ln_w_ = ps.add(h + "ln_2.weight", {C}, Init::Ones, 0.0f, false);
  ln_b_ = ps.add(h + "ln_2.bias", {C}, Init::Zeros, 0.0f, false);
  c_fc_.weight = ps.add(h + "mlp.c_fc.weight", {C, 4 * C}, Init::Normal, kInitStd, true,
                        part(1, hidden_local_));
  c_fc_.bias =
      ps.add(h + "mlp.c_fc.bias", {4 * C}, Init::Zeros, 0.0f, false, part(0, hidden_local_));
  c_fc_.in = C, c_fc_.out = hidden_local_;
  c_proj_.weight = ps.add(h + "mlp.c_proj.weight", {4 * C, C}, Init::Normal, proj_std, true,
                          part(0, hidden_local_));
  c_proj_.bias = ps.add(h + "mlp.c_proj.bias", {C}, Init::Zeros, 0.0f, false);
  c_proj_.in = hidden_local_, c_proj_.out = C;
  mark_sequence_partial(ps, ln_w_, split);
  mark_sequence_partial(ps, ln_b_, split);
  ps.mark_gemm_weight(c_fc_.weight);
  ps.mark_gemm_weight(c_proj_.weight);
  site_drop_ = stable_hash(h + "mlp.dropout");
}

void GeluMlp::allocate(GeluMlpRecord& r, int max_batch, Allocator& alloc,
                       std::vector<NamedActivation>* list, DType gemm_inputs) const {
  const int64_t BT = max_batch * rows_per_sequence_, C = cfg_.n_embd;
  ActivationAllocator a(alloc, BT, list);
  ActivationAllocator rows(alloc, token_range(split_, BT).per, list, split_.sequence_parallel());
  const std::string h = "h." + std::to_string(layer_) + ".";
  r.ln2 = rows(h + "ln_2", C, gemm_inputs);
  r.ln2_mean = rows(h + "ln_2.mean", 1);
  r.ln2_rstd = rows(h + "ln_2.rstd", 1);
  r.fc = a(h + "fc", hidden_local_);
  r.fch = a(h + "fc.gelu", hidden_local_, gemm_inputs);
  if (cfg_.dropout > 0.0f) r.mask = rows(h + "mlp.dropout.mask", C, DType::U8);
}

std::unique_ptr<MlpRecord> GeluMlp::make_record(int max_batch, Allocator& alloc,
                                                std::vector<NamedActivation>* list) const {
  auto r = std::make_unique<GeluMlpRecord>();
  if (recompute_ != Recompute::Full)
    allocate(*r, max_batch, alloc, list, bf16_gemm_inputs_ ? DType::BF16 : DType::F32);
  return r;
}

void GeluMlp::reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const {
  // recomputed activations are fp32
  reserve_mlp_record<GeluMlpRecord>(ws, kind(), recompute_, [&](GeluMlpRecord& r) {
    allocate(r, max_batch, alloc, nullptr, DType::F32);
  });
}

GeluMlpRecord& GeluMlp::scratch(BlockWorkspace& ws) const {
  return reserved_mlp_record<GeluMlpRecord>(ws, kind(), layer_);
}

void GeluMlp::run_forward(const BlockPass& mb, const float* x, float* y, GeluMlpRecord& r,
                          BlockWorkspace& ws) const {
  const int64_t BT = mb.tokens(), C = cfg_.n_embd, F = hidden_local_;
  const TpRegion tp = branch_region(split_, mb, ws, cfg_.n_embd);
  const int R = static_cast<int>(tp.rows.size());
  ps_.refresh_bf16_copy(c_fc_.weight);
  ps_.refresh_bf16_copy(c_proj_.weight);
  float* ln2 = staging(r.ln2, ws.dln);
  k::layernorm_forward(ln2, r.ln2_mean.f32(), r.ln2_rstd.f32(), x, ps_.param_data(ln_w_),
                       ps_.param_data(ln_b_), R, static_cast<int>(C), cfg_.ln_eps);
  keep_rounded(r.ln2, ln2, R * C);
  column_linear(tp, ps_, c_fc_, r.fc.f32(), ln2, kept(r.ln2));
  float* fch = staging(r.fch, ws.dfch);
  k::gelu_forward(fch, r.fc.f32(), BT * F);
  keep_rounded(r.fch, fch, BT * F);
  const BranchDropout drop = branch_dropout(mb, tp, site_drop_, r.mask);
  if (y == nullptr) {  // a recomputation needs only the mask of the last dropout
    drop.draw_mask(R, static_cast<int>(C));
    return;
  }
  row_linear(tp, ps_, c_proj_, y, kept(r.fch), x, drop);
}

void GeluMlp::forward(const BlockPass& mb, const float* x, float* y, MlpRecord& r,
                      BlockWorkspace& ws) const {
  // Under full recomputation everything goes to the workspace and is dropped.
  run_forward(mb, x, y,
              recompute_ == Recompute::Full ? scratch(ws) : static_cast<GeluMlpRecord&>(r), ws);
}

void GeluMlp::recompute(const BlockPass& mb, const float* x, BlockWorkspace& ws) const {
  run_forward(mb, x, nullptr, scratch(ws), ws);
}

size_t GeluMlp::deferred_bytes(int64_t tokens) const {
  return allocated_bytes([&](Allocator* a) { return make_deferred(tokens, a); });
}

std::shared_ptr<GeluMlpRecord::Deferred> GeluMlp::make_deferred(int64_t tokens,
                                                                Allocator* alloc) const {
  const int64_t C = cfg_.n_embd;
  auto d = std::make_shared<GeluMlpRecord::Deferred>();
  d->tokens = tokens;
  auto make = [&](int64_t width, const char* name) {
    return Tensor::zeros({tokens * width}, DType::F32, MemCategory::Activations, name, alloc);
  };
  d->d_proj = make(C, "block.deferred.d_mlp_proj");
  d->d_fc = make(hidden_local_, "block.deferred.d_fc");
  // The record has no whole ln_2 under full recomputation or sequence parallelism.
  if (recompute_ == Recompute::Full || split_.sequence_parallel())
    d->ln2 = make(C, "block.deferred.ln_2");
  if (recompute_ == Recompute::Full) d->fch = make(hidden_local_, "block.deferred.fch");
  return d;
}

GeluMlpRecord::Deferred& GeluMlp::deferred_for(const BlockPass& mb, GeluMlpRecord& r) const {
  return nn::deferred_for(r, mb.tokens(), [&](int64_t n) { return make_deferred(n, nullptr); });
}

void GeluMlp::backward(const BlockPass& mb, const float* x, MlpRecord& record, float* dres,
                       BlockWorkspace& ws, bool defer) const {
  GeluMlpRecord& r = static_cast<GeluMlpRecord&>(record);
  GeluMlpRecord::Deferred* d = defer ? &deferred_for(mb, r) : nullptr;
  if (recompute_ != Recompute::Full) {
    run_backward(mb, x, r, dres, ws, d);
    return;
  }
  const GeluMlpRecord& full = scratch(ws);  // recomputed by the block
  run_backward(mb, x, full, dres, ws, d);
  if (d)  // W needs gelu(fc), which lives in the shared scratch (ln_2: run_backward kept it)
    std::memcpy(d->fch.f32(), full.fch.f32(),
                sizeof(float) * static_cast<size_t>(mb.tokens() * hidden_local_));
}

void GeluMlp::run_backward(const BlockPass& mb, const float* x, const GeluMlpRecord& r, float* dres,
                           BlockWorkspace& ws, GeluMlpRecord::Deferred* defer) const {
  const int BT = static_cast<int>(mb.tokens()), C = cfg_.n_embd;
  const int F = static_cast<int>(hidden_local_);
  const TpRegion tp = branch_region(split_, mb, ws, cfg_.n_embd);
  const int R = static_cast<int>(tp.rows.size());
  auto g = [&](int i) { return defer ? nullptr : ps_.grad_data(i); };
  auto keep = [&](Tensor& slot, const float* from, int64_t width) {
    if (defer && slot.defined())
      std::memcpy(slot.f32(), from, sizeof(float) * static_cast<size_t>(BT * width));
  };
  const float* dy = row_linear_grad_output(tp, dres, branch_dropout(mb, tp, site_drop_, r.mask));
  float* dfch = ws.dfch.f32();
  if (defer) keep(defer->d_proj, dy, C);
  k::matmul_backward(dfch, g(c_proj_.weight), g(c_proj_.bias), dy, kept(r.fch),
                     ps_.gemm_weight(c_proj_.weight), BT, F, C);
  k::gelu_backward(dfch, dfch, r.fc.f32(), static_cast<int64_t>(BT) * F);
  if (defer) keep(defer->d_fc, dfch, F);
  const k::GemmInput ln2 = column_linear_input(tp, r.ln2);
  if (defer && defer->ln2.defined()) {
    TESSERA_ASSERT(ln2.f32 != nullptr, "a zero-bubble copy of a bf16-kept input");
    keep(defer->ln2, ln2.f32, C);
  }
  float* dln = ws.dln.f32();
  k::matmul_backward(dln, g(c_fc_.weight), g(c_fc_.bias), dfch, ln2, ps_.gemm_weight(c_fc_.weight),
                     BT, C, F);
  k::layernorm_backward(dres, ps_.grad_data(ln_w_), ps_.grad_data(ln_b_),
                        column_linear_grad_input(tp, dln), x, ps_.param_data(ln_w_),
                        r.ln2_mean.f32(), r.ln2_rstd.f32(), R, C);
}

void GeluMlp::backward_weight(const BlockPass& mb, MlpRecord& record) const {
  GeluMlpRecord& r = static_cast<GeluMlpRecord&>(record);
  TESSERA_ASSERT(r.deferred != nullptr, "backward_weight of h.", layer_,
                 ".mlp without a deferred backward");
  const GeluMlpRecord::Deferred& d = *r.deferred;
  const int BT = static_cast<int>(mb.tokens()), C = cfg_.n_embd;
  const int F = static_cast<int>(hidden_local_);
  auto in = [](const Tensor& copy, const Tensor& rec) { return kept(copy.defined() ? copy : rec); };
  k::matmul_backward(nullptr, ps_.grad_data(c_proj_.weight), ps_.grad_data(c_proj_.bias),
                     d.d_proj.f32(), in(d.fch, r.fch), nullptr, BT, F, C);
  k::matmul_backward(nullptr, ps_.grad_data(c_fc_.weight), ps_.grad_data(c_fc_.bias), d.d_fc.f32(),
                     in(d.ln2, r.ln2), nullptr, BT, C, F);
}

}  // namespace tessera::nn
