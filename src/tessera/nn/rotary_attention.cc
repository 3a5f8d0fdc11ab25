#include "tessera/nn/rotary_attention.h"

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/attention.h"
#include "tessera/kernels/rmsnorm.h"
#include "tessera/kernels/rope.h"
#include "tessera/nn/kept_input.h"

namespace tessera::nn {

namespace k = tessera::kernels;

std::shared_ptr<const RotaryTable> rotary_table(const GPTConfig& cfg) {
  using Key = std::tuple<int, int64_t, double, double, double, double, double>;
  static std::mutex mu;
  static std::map<Key, std::weak_ptr<const RotaryTable>> cache;
  const k::RopeScaling& s = cfg.rope_scaling;
  const Key key{cfg.head_dim(),    cfg.block_size,     cfg.rope_theta,          s.factor,
                s.low_freq_factor, s.high_freq_factor, s.original_max_positions};
  std::lock_guard<std::mutex> lock(mu);
  if (auto t = cache[key].lock()) return t;
  auto t = std::make_shared<RotaryTable>();
  t->head_dim = cfg.head_dim();
  t->positions = cfg.block_size;
  std::vector<float> inv_freq(static_cast<size_t>(t->head_dim / 2));
  k::rope_inverse_frequencies(inv_freq.data(), t->head_dim, cfg.rope_theta, s);
  const size_t n = static_cast<size_t>(t->positions) * inv_freq.size();
  t->cos.resize(n);
  t->sin.resize(n);
  k::rope_tables(t->cos.data(), t->sin.data(), inv_freq.data(), t->head_dim, t->positions);
  cache[key] = t;
  return t;
}

RotaryAttention::RotaryAttention(ParameterSet& ps, const GPTConfig& cfg, int layer,
                                 const TensorSplit& split, const ContextSplit& context,
                                 Recompute recompute, bool bf16_gemm_inputs)
    : AttentionBranch(recompute, context), ps_(ps), cfg_(cfg), layer_(layer), split_(split) {
  const int t = split.size(), r = split.rank();
  const int Hq = cfg.n_head, Hkv = cfg.kv_heads(), D = cfg.head_dim();
  const int64_t C = cfg.n_embd;
  TESSERA_CHECK_AS(ConfigError, Hq % t == 0 && Hkv % t == 0, "the tensor-parallel size ", t,
                   " must divide the key/value heads (", Hkv, ") as well as the attention heads (",
                   Hq, "): tensor parallelism splits key/value heads, it does not replicate them");
  heads_ = {Hq / t, Hkv / t, D};
  c_local_ = int64_t{heads_.q} * D;
  // The output rows [r len, (r + 1) len) of an [out, in] weight (its bias likewise).
  auto rows = [&](int64_t len) { return t == 1 ? ShardSpec{} : ShardSpec{0, 1, r * len, len}; };
  const std::string h = "model.layers." + std::to_string(layer) + ".";
  norm_ = ps.add(h + "input_layernorm.weight", {C}, Init::Ones, 0.0f, false);
  auto column = [&](Linear& l, const char* name, int heads, int64_t global_heads) {
    const int64_t out = int64_t{heads} * D;
    l.weight = ps.add(h + "self_attn." + name + ".weight", {global_heads * D, C}, Init::Normal,
                      kInitStd, true, rows(out));
    if (cfg.qkv_bias)
      l.bias = ps.add(h + "self_attn." + name + ".bias", {global_heads * D}, Init::Zeros, 0.0f,
                      false, rows(out));
    l.in = C, l.out = out, l.transposed = true;
    ps.mark_gemm_weight(l.weight);
  };
  column(q_, "q_proj", heads_.q, Hq);
  column(k_, "k_proj", heads_.kv, Hkv);
  column(v_, "v_proj", heads_.kv, Hkv);
  o_.weight = ps.add(h + "self_attn.o_proj.weight", {C, int64_t{Hq} * D}, Init::Normal, kInitStd,
                     true, t == 1 ? ShardSpec{} : ShardSpec{1, 1, r * c_local_, c_local_});
  if (cfg.o_bias) o_.bias = ps.add(h + "self_attn.o_proj.bias", {C}, Init::Zeros, 0.0f, false);
  o_.in = c_local_, o_.out = C, o_.transposed = true;
  ps.mark_gemm_weight(o_.weight);
  mark_sequence_partial(ps, norm_, split);  // the norm sees this rank's rows only
  rope_ = rotary_table(cfg);
  core_.heads = {heads_.q, heads_.kv, heads_.size};
  core_.head_offset = r * heads_.q;
  core_.n_head = Hq;
  core_.drop_site = stable_hash(h + "self_attn.attention_dropout");
  core_.rows_per_sequence = context.rows_per_sequence(cfg.block_size);
  core_.bf16_gemm_inputs = bf16_gemm_inputs;
  core_.prefix = h;
  check_context_heads(context.comm, context.size(), core_.heads);  // Ulysses' rule
}

void RotaryAttention::allocate_rest(AttentionRecord& r, int max_batch, Allocator& alloc,
                                    std::vector<NamedActivation>* list, DType gemm_inputs) const {
  const int64_t BT = max_batch * core_.rows_per_sequence;
  ActivationAllocator a(alloc, BT, list);
  ActivationAllocator rows(alloc, token_range(split_, BT).per, list, split_.sequence_parallel());
  const std::string h = "model.layers." + std::to_string(layer_) + ".";
  r.ln1 = rows(h + "input_layernorm", cfg_.n_embd, gemm_inputs);
  r.ln1_rstd = rows(h + "input_layernorm.rstd", 1);
  r.qkv = a(h + "qkv", heads_.width());
}

void RotaryAttention::rotate(float* qkv, const BlockPass& mb, bool inverse) const {
  const int64_t BT = mb.tokens();
  std::vector<int64_t> pos(static_cast<size_t>(BT));
  // Each row's global position (a context-parallel rank's share: its load-balanced positions).
  const kernels::RowMap map = mb.row_map();
  for (int64_t i = 0; i < BT; ++i) pos[static_cast<size_t>(i)] = map.position(i % mb.T);
  const int D = heads_.size;
  const int64_t W = heads_.width();
  k::rope_apply(qkv, BT, heads_.q, D, W, pos.data(), rope_->cos.data(), rope_->sin.data(), inverse);
  k::rope_apply(qkv + q_.out, BT, heads_.kv, D, W, pos.data(), rope_->cos.data(), rope_->sin.data(),
                inverse);
}

void RotaryAttention::run_forward(const BlockPass& mb, const float* x, float* y, AttentionRecord& r,
                                  BlockWorkspace& ws) const {
  const int64_t BT = mb.tokens(), C = cfg_.n_embd, W = heads_.width();
  const TpRegion tp = branch_region(split_, mb, ws, C);
  const int64_t R = tp.rows.size();
  for (const Linear* l : {&q_, &k_, &v_, &o_}) ps_.refresh_bf16_copy(l->weight);
  float* n = staging(r.ln1, ws.dln);
  k::rmsnorm_forward(n, r.ln1_rstd.f32(), x, ps_.param_data(norm_), R, C, cfg_.ln_eps);
  keep_rounded(r.ln1, n, R * C);
  const k::GemmInput in = enter_tp(tp, n, kept(r.ln1));  // gathered once for q, k and v
  float* qkv = r.qkv.f32();
  if (const auto f = fused(ps_, {&q_, &k_, &v_})) {  // one GEMM when the weights are adjacent
    linear_forward(ps_, *f, qkv, W, in, BT);
  } else {
    linear_forward(ps_, q_, qkv, W, in, BT);
    linear_forward(ps_, k_, qkv + q_.out, W, in, BT);
    linear_forward(ps_, v_, qkv + q_.out + k_.out, W, in, BT);
  }
  rotate(qkv, mb, false);
  core_forward(mb, qkv, r.atty.f32(), r.lse.f32(), ws);
  if (y == nullptr) return;  // recomputing an attention half: nothing more for the backward
  row_linear(tp, ps_, o_, y, kept(r.atty), x, BranchDropout{});
}

std::shared_ptr<AttentionRecord::Deferred> RotaryAttention::make_deferred(int64_t tokens,
                                                                          Allocator* alloc) const {
  const int64_t C = cfg_.n_embd;
  auto d = std::make_shared<AttentionRecord::Deferred>();
  d->tokens = tokens;
  auto make = [&](int64_t width, const char* name) {
    return Tensor::zeros({tokens * width}, DType::F32, MemCategory::Activations, name, alloc);
  };
  d->d_proj = make(C, "block.deferred.d_attn_proj");
  d->d_attn = make(heads_.width(), "block.deferred.d_qkv");
  if (recompute_ == Recompute::Full || split_.sequence_parallel())
    d->ln1 = make(C, "block.deferred.ln_1");
  if (recompute_ != Recompute::None) d->atty = make(c_local_, "block.deferred.atty");
  return d;
}

void RotaryAttention::run_backward(const BlockPass& mb, const float* x, const AttentionRecord& r,
                                   float* dres, BlockWorkspace& ws,
                                   AttentionRecord::Deferred* defer) const {
  const int64_t BT = mb.tokens(), C = cfg_.n_embd, W = heads_.width();
  const TpRegion tp = branch_region(split_, mb, ws, C);
  const int64_t R = tp.rows.size();
  auto g = [&](int i) { return defer || i < 0 ? nullptr : ps_.grad_data(i); };
  auto keep = [&](Tensor& slot, const float* from, int64_t width) {
    if (defer && slot.defined())
      std::memcpy(slot.f32(), from, sizeof(float) * static_cast<size_t>(BT * width));
  };
  const float* dy = row_linear_grad_output(tp, dres, BranchDropout{});
  if (defer) keep(defer->d_proj, dy, C);
  float* datty = ws.datty.f32();
  linear_backward(ps_, o_, datty, false, g(o_.weight), g(o_.bias), dy, C, kept(r.atty), BT);
  float* dqkv = ws.dqkv.f32();
  core_backward(mb, r, datty, dqkv, ws);
  rotate(dqkv, mb, true);  // the gradients of q and k before their rotation
  if (defer) keep(defer->d_attn, dqkv, W);
  const k::GemmInput in = column_linear_input(tp, r.ln1);
  if (defer && defer->ln1.defined()) {
    TESSERA_ASSERT(in.f32 != nullptr, "a zero-bubble copy of a bf16-kept input");
    keep(defer->ln1, in.f32, C);
  }
  float* dn = ws.dln.f32();
  if (const auto f = fused(ps_, {&q_, &k_, &v_})) {
    linear_backward(ps_, *f, dn, false, g(f->weight), g(f->bias), dqkv, W, in, BT);
  } else {
    linear_backward(ps_, q_, dn, false, g(q_.weight), g(q_.bias), dqkv, W, in, BT);
    linear_backward(ps_, k_, dn, true, g(k_.weight), g(k_.bias), dqkv + q_.out, W, in, BT);
    linear_backward(ps_, v_, dn, true, g(v_.weight), g(v_.bias), dqkv + q_.out + k_.out, W, in, BT);
  }
  k::rmsnorm_backward(dres, ps_.grad_data(norm_), column_linear_grad_input(tp, dn), x,
                      ps_.param_data(norm_), r.ln1_rstd.f32(), R, C);
}

void RotaryAttention::backward_weight(const BlockPass& mb, AttentionRecord& r) const {
  TESSERA_ASSERT(r.deferred != nullptr, "backward_weight of layer ", layer_,
                 "'s attention without a deferred backward");
  const AttentionRecord::Deferred& d = *r.deferred;
  const int64_t BT = mb.tokens(), C = cfg_.n_embd, W = heads_.width();
  auto in = [](const Tensor& copy, const Tensor& rec) { return kept(copy.defined() ? copy : rec); };
  auto grad = [&](int i) { return i < 0 ? nullptr : ps_.grad_data(i); };
  linear_backward(ps_, o_, nullptr, false, grad(o_.weight), grad(o_.bias), d.d_proj.f32(), C,
                  in(d.atty, r.atty), BT);
  const k::GemmInput n = in(d.ln1, r.ln1);
  const float* dqkv = d.d_attn.f32();
  if (const auto f = fused(ps_, {&q_, &k_, &v_})) {
    linear_backward(ps_, *f, nullptr, false, grad(f->weight), grad(f->bias), dqkv, W, n, BT);
    return;
  }
  linear_backward(ps_, q_, nullptr, false, grad(q_.weight), grad(q_.bias), dqkv, W, n, BT);
  linear_backward(ps_, k_, nullptr, false, grad(k_.weight), grad(k_.bias), dqkv + q_.out, W, n, BT);
  linear_backward(ps_, v_, nullptr, false, grad(v_.weight), grad(v_.bias), dqkv + q_.out + k_.out,
                  W, n, BT);
}

void RotaryAttention::decode(const DecodeStep& step, const float* x, float* y, KvLayer& kv,
                             DecodeScratch& s, BlockWorkspace& ws) const {
  TESSERA_ASSERT(split_.size() == 1, "layer ", layer_,
                 "'s attention: decode without tensor parallelism only");
  TESSERA_ASSERT(step.end() <= rope_->positions, "layer ", layer_, "'s attention: position ",
                 step.end() - 1, " is past the rotary table's ", rope_->positions);
  const int n = step.n, D = heads_.size;
  const int64_t C = cfg_.n_embd, W = heads_.width(), KV = int64_t{heads_.kv} * D;
  for (const Linear* l : {&q_, &k_, &v_, &o_}) ps_.refresh_bf16_copy(l->weight);
  float* norm = s.norm.f32();
  k::rmsnorm_forward(norm, s.rstd.f32(), x, ps_.param_data(norm_), n, C, cfg_.ln_eps);
  float* qkv = s.qkv.f32();
  if (const auto f = fused(ps_, {&q_, &k_, &v_})) {
    linear_forward(ps_, *f, qkv, W, norm, n);
  } else {
    linear_forward(ps_, q_, qkv, W, norm, n);
    linear_forward(ps_, k_, qkv + q_.out, W, norm, n);
    linear_forward(ps_, v_, qkv + q_.out + k_.out, W, norm, n);
  }
  int64_t* pos = s.position.data();
  for (int i = 0; i < n; ++i) pos[i] = step.pos0 + i;
  k::rope_apply(qkv, n, heads_.q, D, W, pos, rope_->cos.data(), rope_->sin.data());
  k::rope_apply(qkv + q_.out, n, heads_.kv, D, W, pos, rope_->cos.data(), rope_->sin.data());
  // The new (rotated) keys and values at their positions, then the attention over all of them.
  const size_t row = sizeof(float) * static_cast<size_t>(KV);
  for (int i = 0; i < n; ++i) {
    std::memcpy(kv.k.f32() + (step.pos0 + i) * KV, qkv + i * W + q_.out, row);
    std::memcpy(kv.v.f32() + (step.pos0 + i) * KV, qkv + i * W + q_.out + KV, row);
  }
  k::attention_decode(s.atty.f32(), qkv, W, kv.k.f32(), kv.v.f32(), KV, n, step.pos0,
                      k::AttentionHeads{heads_.q, heads_.kv, D}, s.scores.f32());
  const TpRegion tp(split_, n, C, nullptr, ws.proj.f32());
  row_linear(tp, ps_, o_, y, s.atty.f32(), x, BranchDropout{});
}

}  // namespace tessera::nn
