#include "tessera/nn/swiglu_moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/kernels/rmsnorm.h"
#include "tessera/kernels/swiglu.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {
// The norm is registered before the router (the parameter order of a Llama-family block).
int add_norm(ParameterSet& ps, const GPTConfig& cfg, int layer) {
  return ps.add("model.layers." + std::to_string(layer) + ".post_attention_layernorm.weight",
                {cfg.n_embd}, Init::Ones, 0.0f, false);
}

// t holds at least n elements afterwards (grown by a quarter when too small; contents not kept).
float* ensure(Tensor& t, int64_t n, const char* name, Allocator* alloc) {
  if (!t.defined() || t.numel() < n)
    t = Tensor::zeros({std::max<int64_t>(16, n + n / 4)}, DType::F32, MemCategory::Activations,
                      name, alloc);
  return t.f32();
}
}  // namespace

SwigluMoeMlp::SwigluMoeMlp(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
                           const TensorSplit& split, ExpertSplit expert_split,
                           const ContextSplit& context, Recompute recompute)
    : ps_(ps),
      cfg_(cfg),
      layer_(layer),
      split_(split),
      recompute_(recompute),
      rows_per_sequence_(context.rows_per_sequence(cfg.block_size)),
      norm_(add_norm(ps, cfg, layer)),
      moe_(ps, experts, cfg, layer, expert_split, context) {
  mark_sequence_partial(ps, norm_, split);
  const int64_t Fs = cfg.moe.shared_ffn_dim, C = cfg.n_embd;
  if (Fs == 0) return;
  const int t = split.size(), r = split.rank();
  TESSERA_CHECK_AS(ConfigError, Fs % t == 0, "the tensor-parallel size ", t,
                   " must divide the shared expert's width ", Fs, " (--moe-shared-ffn-dim)");
  shared_local_ = Fs / t;
  const int64_t Fl = shared_local_;
  const MoeNames& names = moe_.names();
  auto column = [&](Linear& l, const char* which) {
    l.weight = ps.add(names.shared(which) + ".weight", {Fs, C}, Init::Normal, kInitStd, true,
                      t == 1 ? ShardSpec{} : ShardSpec{0, 1, r * Fl, Fl});
    l.in = C, l.out = Fl, l.transposed = true;
    ps.mark_gemm_weight(l.weight);
  };
  column(s_gate_, "gate");
  column(s_up_, "up");
  s_down_.weight = ps.add(names.shared("down") + ".weight", {C, Fs}, Init::Normal, kInitStd, true,
                          t == 1 ? ShardSpec{} : ShardSpec{1, 1, r * Fl, Fl});
  s_down_.in = Fl, s_down_.out = C, s_down_.transposed = true;
  ps.mark_gemm_weight(s_down_.weight);
  if (cfg.moe.shared_gate) {
    gate_w_ = ps.add(names.shared_gate(), {1, C}, Init::Normal, kInitStd, true);
    mark_sequence_partial(ps, gate_w_, split);  // each rank's rows' part under --sp
  }
}

void SwigluMoeMlp::allocate(SwigluMoeMlpRecord& r, int max_batch, Allocator& alloc,
                            std::vector<NamedActivation>* list) const {
  const int64_t BT = max_batch * rows_per_sequence_, C = cfg_.n_embd;
  const TokenRange rows_of = token_range(split_, BT);
  ActivationAllocator rows(alloc, rows_of.per, list, split_.sequence_parallel());
  ActivationAllocator all(alloc, BT, list);
  const std::string h = "model.layers." + std::to_string(layer_) + ".";
  if (split_.sequence_parallel())  // every rank's rows, gathered (padded)
    r.ln2 =
        ActivationAllocator(alloc, rows_of.padded(), nullptr)(h + "post_attention_layernorm", C);
  else
    r.ln2 = rows(h + "post_attention_layernorm", C);
  r.ln2_rstd = rows(h + "post_attention_layernorm.rstd", 1);
  r.moe = std::make_shared<MixtureOfExperts::Record>(moe_.make_record(max_batch, alloc));
  const std::string& p = moe_.names().prefix;
  if (list) {  // the router's [B T, E] activations (the experts' rows vary with routing)
    const int64_t E = cfg_.moe.experts;
    list->push_back({p + "gate.logits", r.moe->logits, E});
    list->push_back({p + "gate.probs", r.moe->probs, E});
  }
  if (!shared()) return;
  r.gu = all(p + "shared_expert.gate_up", 2 * shared_local_);
  r.h = all(p + "shared_expert.swiglu", shared_local_);
  if (gate_w_ >= 0) {
    r.gate = all(p + "shared_expert_gate.sigmoid", 1);
    r.shared = rows(p + "shared_expert", C);
  }
}

std::unique_ptr<MlpRecord> SwigluMoeMlp::make_record(int max_batch, Allocator& alloc,
                                                     std::vector<NamedActivation>* list) const {
  auto r = std::make_unique<SwigluMoeMlpRecord>();
  if (recompute_ != Recompute::Full) allocate(*r, max_batch, alloc, list);
  return r;
}

void SwigluMoeMlp::reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const {
  if (!ws.moe)
    ws.moe = std::make_shared<MixtureOfExperts::Workspace>(MixtureOfExperts::make_workspace(alloc));
  reserve_mlp_record<SwigluMoeMlpRecord>(ws, kind(), recompute_, [&](SwigluMoeMlpRecord& r) {
    allocate(r, max_batch, alloc, nullptr);
  });
}

SwigluMoeMlpRecord& SwigluMoeMlp::scratch(BlockWorkspace& ws) const {
  return reserved_mlp_record<SwigluMoeMlpRecord>(ws, kind(), layer_);
}

void SwigluMoeMlp::run_forward(const BlockPass& mb, const float* x, float* y, SwigluMoeMlpRecord& r,
                               BlockWorkspace& ws) const {
  const int64_t C = cfg_.n_embd, N = mb.tokens();
  const TpRegion tp = branch_region(split_, mb, ws, C);
  const int64_t R = tp.rows.size();
  // Under sequence parallelism this rank's rows go to their place of the gathered record.
  float* ln2 = r.ln2.f32() + (tp.sequence() ? tp.rows.place() * C : 0);
  k::rmsnorm_forward(ln2, r.ln2_rstd.f32(), x, ps_.param_data(norm_), R, C, cfg_.ln_eps);
  if (tp.sequence()) {  // gathered in fp32 whatever the wire: the router reads fp32
    TensorSplit fp32_wire = split_;
    fp32_wire.wire = DType::F32;
    gather_to_tp(fp32_wire, ln2, r.ln2.f32(), tp.rows, C);
  }
  const float* n = r.ln2.f32();  // every token
  // The routed experts: complete on every tp rank, no reduce point.
  float* routed = ws.proj.f32();
  moe_.forward(n, routed, mb.B, mb.T, mb.loss_scale, *r.moe, *ws.moe, y != nullptr && mb.training,
               mb.positions);
  const float* shared_rows = nullptr;  // this rank's rows of the shared expert's output
  if (shared()) {
    const int64_t F = shared_local_;
    for (const Linear* l : {&s_gate_, &s_up_, &s_down_}) ps_.refresh_bf16_copy(l->weight);
    float* gu = r.gu.f32();
    linear_forward(ps_, s_gate_, gu, 2 * F, n, N);
    linear_forward(ps_, s_up_, gu + F, 2 * F, n, N);
    k::swiglu_forward(r.h.f32(), gu, gu + F, N, F, 2 * F);
    if (gate_w_ >= 0) {  // g = sigmoid(n . w) of every token
      const float* w = ps_.param_data(gate_w_);
      float* g = r.gate.f32();
      for (int64_t t = 0; t < N; ++t) {
        double z = 0;
        for (int64_t c = 0; c < C; ++c) z += static_cast<double>(n[t * C + c]) * w[c];
        g[t] = static_cast<float>(1.0 / (1.0 + std::exp(-z)));
      }
    }
    // A recomputation needs the output only for the gate's backward.
    if (y != nullptr || gate_w_ >= 0) {
      float* partial = ws.dln.f32();  // [padded tokens, C]: this rank's columns' part
      linear_forward(ps_, s_down_, partial, C, r.h.f32(), N);
      float* sum = tp.sequence() ? reduce_scatter_from_tp(split_, partial,
                                                          partial + tp.rows.place() * C, tp.rows, C)
                                 : reduce_from_tp(split_, partial, N * C);
      if (gate_w_ >= 0)
        std::memcpy(r.shared.f32(), sum, sizeof(float) * static_cast<size_t>(R * C));
      shared_rows = sum;
    }
  }
  if (y == nullptr) return;  // a recomputation: the backward has what it needs
  // y = x + (routed + g shared) on this rank's rows (Hugging Face's order of the sums).
  const float* g = gate_w_ >= 0 ? r.gate.f32() : nullptr;
  for (int64_t i = 0; i < R; ++i) {
    const int64_t t = tp.rows.begin + i;
    const float* m = routed + t * C;
    const float* xi = x + i * C;
    float* yi = y + i * C;
    if (!shared_rows) {
      for (int64_t c = 0; c < C; ++c) yi[c] = xi[c] + m[c];
      continue;
    }
    const float gt = g ? g[t] : 1.0f;
    const float* s = shared_rows + i * C;
    for (int64_t c = 0; c < C; ++c) yi[c] = xi[c] + (m[c] + gt * s[c]);
  }
}

void SwigluMoeMlp::forward(const BlockPass& mb, const float* x, float* y, MlpRecord& r,
                           BlockWorkspace& ws) const {
  run_forward(mb, x, y,
              recompute_ == Recompute::Full ? scratch(ws) : static_cast<SwigluMoeMlpRecord&>(r),
              ws);
}

void SwigluMoeMlp::recompute(const BlockPass& mb, const float* x, BlockWorkspace& ws) const {
  run_forward(mb, x, nullptr, scratch(ws), ws);
}

void SwigluMoeMlp::backward(const BlockPass& mb, const float* x, MlpRecord& r, float* dres,
                            BlockWorkspace& ws, bool defer) const {
  (void)defer;  // the mixture computes all its gradients now, also under the zero-bubble split
  run_backward(mb, x,
               recompute_ == Recompute::Full ? scratch(ws) : static_cast<SwigluMoeMlpRecord&>(r),
               dres, ws);
}

void SwigluMoeMlp::run_backward(const BlockPass& mb, const float* x, SwigluMoeMlpRecord& r,
                                float* dres, BlockWorkspace& ws) const {
  const int64_t C = cfg_.n_embd, N = mb.tokens();
  const TpRegion tp = branch_region(split_, mb, ws, C);
  const int64_t R = tp.rows.size();
  // Every token's output gradient (all-gathered under sequence parallelism).
  const float* dy = row_linear_grad_output(tp, dres, BranchDropout{});
  const float* n = r.ln2.f32();
  // The mixture's input gradient, complete on every tp rank.
  float* dln = ws.dln.f32();
  moe_.backward(*r.moe, dy, dln, *ws.moe);
  float* dln_rows = dln + tp.rows.begin * C;
  if (shared()) {
    const int64_t F = shared_local_;
    auto grad = [&](int i) { return ps_.grad_data(i); };
    const float* g = gate_w_ >= 0 ? r.gate.f32() : nullptr;
    // The gate, on this rank's rows: dz = g (1 - g) (dy . shared); dw += dz n; dn += dz w.
    std::vector<float> dz(static_cast<size_t>(g ? R : 0));
    if (g) {
      const float* s = r.shared.f32();
      const float* n_rows = n + (tp.sequence() ? tp.rows.place() * C : 0);
      std::vector<double> dw(static_cast<size_t>(C), 0.0);
      for (int64_t i = 0; i < R; ++i) {
        const float gt = g[tp.rows.begin + i];
        double dot = 0;
        for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dres[i * C + c]) * s[i * C + c];
        dz[i] = static_cast<float>(dot * gt * (1.0 - gt));
        for (int64_t c = 0; c < C; ++c) dw[c] += static_cast<double>(dz[i]) * n_rows[i * C + c];
      }
      float* gw = grad(gate_w_);
      for (int64_t c = 0; c < C; ++c) gw[c] += static_cast<float>(dw[c]);
    }
    // The shared expert on every token: d shared = g dy, then SwigluMlp's backward.
    const TokenRange all = token_range(split_, N);
    float* ds =
        ensure(ws.moe->shared_d, all.padded() * C, "moe.shared_expert.d_out", ws.moe->alloc);
    for (int64_t t = 0; t < N; ++t) {
      const float gt = g ? g[t] : 1.0f;
      for (int64_t c = 0; c < C; ++c) ds[t * C + c] = gt * dy[t * C + c];
    }
    float* dh = ensure(ws.moe->shared_dh, N * F, "moe.shared_expert.d_swiglu", ws.moe->alloc);
    linear_backward(ps_, s_down_, dh, false, grad(s_down_.weight), nullptr, ds, C, r.h.f32(), N);
    float* gu = r.gu.f32();  // becomes d(gate) | d(up), in place
    k::swiglu_backward(gu, gu + F, dh, gu, gu + F, N, F, 2 * F);
    float* dn = ds;  // d shared is read; this rank's part of the input gradient goes there
    linear_backward(ps_, s_gate_, dn, false, grad(s_gate_.weight), nullptr, gu, 2 * F, n, N);
    linear_backward(ps_, s_up_, dn, true, grad(s_up_.weight), nullptr, gu + F, 2 * F, n, N);
    const float* dn_rows = column_linear_grad_input(tp, dn);  // summed over the group
    const float* w = g ? ps_.param_data(gate_w_) : nullptr;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < C; ++c)
        dln_rows[i * C + c] += dn_rows[i * C + c] + (g ? dz[i] * w[c] : 0.0f);
  }
  k::rmsnorm_backward(dres, ps_.grad_data(norm_), dln_rows, x, ps_.param_data(norm_),
                      r.ln2_rstd.f32(), R, C);
}

void SwigluMoeMlp::backward_weight(const BlockPass& mb, MlpRecord& r) const {
  (void)mb, (void)r;  // nothing deferred (backward computed every gradient)
}

}  // namespace tessera::nn
