#include "tessera/nn/gpt.h"

#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/attention.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/embedding.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/kernels/residual.h"
#include "tessera/kernels/softmax_xent.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {
constexpr float kInitStd = 0.02f;
constexpr float kWpeStd = 0.01f;
}  // namespace

GPT::GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout)
    : cfg_(cfg), max_batch_(max_batch), alloc_(alloc) {
  validate(cfg_);
  TESSERA_CHECK_AS(ConfigError, max_batch > 0, "max_batch must be positive, got ", max_batch);
  const int64_t C = cfg_.n_embd, V = cfg_.vocab_size, L = cfg_.n_layer;
  const float proj_std = kInitStd / std::sqrt(2.0f * static_cast<float>(L));
  TESSERA_CHECK_AS(ConfigError, layout.unit_alignment > 0 && layout.unit_alignment % 16 == 0,
                   "unit alignment must be a positive multiple of 16, got ", layout.unit_alignment);
  auto end_unit = [&] {
    params_.pad_to_multiple(layout.unit_alignment);
    unit_begin_.push_back(params_.numel());
  };
  unit_begin_.push_back(0);
  wte_ = params_.add("wte.weight", {V, C}, Init::Normal, kInitStd, true);
  wpe_ = params_.add("wpe.weight", {cfg_.block_size, C}, Init::Normal, kWpeStd, true);
  end_unit();
  for (int l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    LayerParams q{};
    q.ln1_w = params_.add(h + "ln_1.weight", {C}, Init::Ones, 0.0f, false);
    q.ln1_b = params_.add(h + "ln_1.bias", {C}, Init::Zeros, 0.0f, false);
    q.attn_w = params_.add(h + "attn.c_attn.weight", {C, 3 * C}, Init::Normal, kInitStd, true);
    q.attn_b = params_.add(h + "attn.c_attn.bias", {3 * C}, Init::Zeros, 0.0f, false);
    q.aproj_w = params_.add(h + "attn.c_proj.weight", {C, C}, Init::Normal, proj_std, true);
    q.aproj_b = params_.add(h + "attn.c_proj.bias", {C}, Init::Zeros, 0.0f, false);
    q.ln2_w = params_.add(h + "ln_2.weight", {C}, Init::Ones, 0.0f, false);
    q.ln2_b = params_.add(h + "ln_2.bias", {C}, Init::Zeros, 0.0f, false);
    q.fc_w = params_.add(h + "mlp.c_fc.weight", {C, 4 * C}, Init::Normal, kInitStd, true);
    q.fc_b = params_.add(h + "mlp.c_fc.bias", {4 * C}, Init::Zeros, 0.0f, false);
    q.mproj_w = params_.add(h + "mlp.c_proj.weight", {4 * C, C}, Init::Normal, proj_std, true);
    q.mproj_b = params_.add(h + "mlp.c_proj.bias", {C}, Init::Zeros, 0.0f, false);
    lp_.push_back(q);
    end_unit();
  }
  lnf_w_ = params_.add("ln_f.weight", {C}, Init::Ones, 0.0f, false);
  lnf_b_ = params_.add("ln_f.bias", {C}, Init::Zeros, 0.0f, false);
  end_unit();
  params_.materialize(alloc_, layout.full_params, layout.full_grads);

  // Activations, sized for (max_batch, block_size) and zero-filled once.
  const bool drop = cfg_.dropout > 0.0f;
  x0_ = act("x0", C);
  if (drop) mask_emb_ = act("x0.dropout_mask", C, DType::U8);
  for (int l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    LayerActs a;
    a.ln1 = act(h + "ln_1", C);
    a.ln1_mean = act(h + "ln_1.mean", 1);
    a.ln1_rstd = act(h + "ln_1.rstd", 1);
    a.qkv = act(h + "qkv", 3 * C);
    a.att = act(h + "att", 0);
    if (drop) a.att_drop = act(h + "att.dropped", 0);
    a.atty = act(h + "atty", C);
    a.x_attn = act(h + "x_attn", C);
    a.ln2 = act(h + "ln_2", C);
    a.ln2_mean = act(h + "ln_2.mean", 1);
    a.ln2_rstd = act(h + "ln_2.rstd", 1);
    a.fc = act(h + "fc", 4 * C);
    a.fch = act(h + "fc.gelu", 4 * C);
    a.x_out = act(h + "x_out", C);
    if (drop) {
      a.mask_attn = act(h + "attn.resid_dropout.mask", C, DType::U8);
      a.mask_mlp = act(h + "mlp.dropout.mask", C, DType::U8);
    }
    a.site_attn_drop = stable_hash(h + "attn.attn_dropout");
    a.site_resid_drop = stable_hash(h + "attn.resid_dropout");
    a.site_mlp_drop = stable_hash(h + "mlp.dropout");
    la_.push_back(std::move(a));
  }
  site_emb_drop_ = stable_hash("drop");
  lnf_ = act("ln_f", C);
  lnf_mean_ = act("ln_f.mean", 1);
  lnf_rstd_ = act("ln_f.rstd", 1);
  logits_ = act("logits", V);
  lse_ = act("logsumexp", 1);
  losses_ = act("losses", 1);
  tokens_ = act("tokens", 1, DType::I32);
  targets_ = act("targets", 1, DType::I32);
  const int64_t BT = static_cast<int64_t>(max_batch_) * cfg_.block_size;
  auto ws = [&](const char* name, int64_t n) {
    return Tensor::zeros({n}, DType::F32, MemCategory::Activations, name, &alloc_);
  };
  dres_ = ws("d_residual", BT * C);
  dln_ = ws("d_ln", BT * C);
  datty_ = ws("d_atty", BT * C);
  dqkv_ = ws("d_qkv", BT * 3 * C);
  dfch_ = ws("d_fc", BT * 4 * C);
  if (drop) dproj_ = ws("d_proj", BT * C);
  dscratch_ = ws("d_att", static_cast<int64_t>(cfg_.block_size) * cfg_.block_size);
}

Tensor GPT::act(const std::string& name, int64_t width, DType dt) {
  const int64_t BT = static_cast<int64_t>(max_batch_) * cfg_.block_size;
  const int64_t n = width > 0 ? BT * width : BT * cfg_.n_head * cfg_.block_size;
  Tensor t = Tensor::zeros({n}, dt, MemCategory::Activations, name, &alloc_);
  if (dt == DType::F32) acts_.push_back({name, t, width});
  return t;
}

void GPT::initialize(uint64_t seed) {
  params_.initialize(seed);
}

void GPT::check_batch(const Batch& b) const {
  TESSERA_CHECK_AS(ShapeError, b.B > 0 && b.B <= max_batch_, "batch size B=", b.B,
                   " must be in [1, ", max_batch_, "] (the model's max_batch)");
  TESSERA_CHECK_AS(ShapeError, b.T > 0 && b.T <= cfg_.block_size, "sequence length T=", b.T,
                   " must be in [1, ", cfg_.block_size, "] (block_size)");
  TESSERA_CHECK_AS(ShapeError, b.tokens != nullptr, "batch has no tokens");
  const int V = cfg_.vocab_size;
  for (int i = 0; i < b.B * b.T; ++i) {
    const int32_t id = b.tokens[i];
    TESSERA_CHECK_AS(ConfigError, id >= 0 && id < V, "token id ", id, " at sample ",
                     b.first_sample + i / b.T, " (row ", i / b.T, "), position ", i % b.T,
                     " is outside the vocabulary [0, ", V, ")");
    if (b.targets != nullptr) {
      const int32_t tg = b.targets[i];
      TESSERA_CHECK_AS(ConfigError, tg >= -1 && tg < V, "target id ", tg, " at sample ",
                       b.first_sample + i / b.T, " (row ", i / b.T, "), position ", i % b.T,
                       " is outside [-1, ", V, ")");
    }
  }
}

double GPT::forward(const Batch& b, const StepContext& ctx) {
  check_batch(b);
  const int B = b.B, T = b.T, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size;
  const int BT = B * T;
  B_ = B;
  T_ = T;
  have_targets_ = b.targets != nullptr;
  loss_scale_ = ctx.loss_scale;
  p_drop_ = ctx.training ? cfg_.dropout : 0.0f;
  const bool drop = p_drop_ > 0.0f;
  std::memcpy(tokens_.data<int32_t>(), b.tokens, sizeof(int32_t) * BT);
  if (have_targets_) std::memcpy(targets_.data<int32_t>(), b.targets, sizeof(int32_t) * BT);

  float* x = x0_.f32();
  hook(&UnitHooks::before_forward, 0);
  k::embedding_forward(x, b.tokens, p(wte_), p(wpe_), B, T, C);
  if (drop)
    k::dropout_forward_btc(x, mask_emb_.data<uint8_t>(), x, B, T, C, p_drop_, ctx.seed,
                           mix_stream(ctx.step, site_emb_drop_), b.first_sample);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerParams& q = lp_[l];
    LayerActs& a = la_[l];
    hook(&UnitHooks::before_forward, l + 1);
    k::layernorm_forward(a.ln1.f32(), a.ln1_mean.f32(), a.ln1_rstd.f32(), x, p(q.ln1_w), p(q.ln1_b),
                         BT, C, cfg_.ln_eps);
    k::matmul_forward(a.qkv.f32(), a.ln1.f32(), p(q.attn_w), p(q.attn_b), nullptr, BT, C, 3 * C);
    k::AttentionDropout ad{p_drop_,        ctx.seed, mix_stream(ctx.step, a.site_attn_drop),
                           b.first_sample, 0,        NH};
    k::attention_forward(a.atty.f32(), a.att.f32(), drop ? a.att_drop.f32() : nullptr, a.qkv.f32(),
                         B, T, C, NH, drop ? &ad : nullptr);
    if (drop) {                  // x_attn = x + dropout(atty W + b)
      float* pr = dproj_.f32();  // free until backward; used as the projection's scratch
      k::matmul_forward(pr, a.atty.f32(), p(q.aproj_w), p(q.aproj_b), nullptr, BT, C, C);
      k::dropout_forward_btc(pr, a.mask_attn.data<uint8_t>(), pr, B, T, C, p_drop_, ctx.seed,
                             mix_stream(ctx.step, a.site_resid_drop), b.first_sample);
      k::residual_forward(a.x_attn.f32(), x, pr, static_cast<int64_t>(BT) * C);
    } else {  // fused: x_attn = x + atty W + b
      k::matmul_forward(a.x_attn.f32(), a.atty.f32(), p(q.aproj_w), p(q.aproj_b), x, BT, C, C);
    }
    k::layernorm_forward(a.ln2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), a.x_attn.f32(),
                         p(q.ln2_w), p(q.ln2_b), BT, C, cfg_.ln_eps);
    k::matmul_forward(a.fc.f32(), a.ln2.f32(), p(q.fc_w), p(q.fc_b), nullptr, BT, C, 4 * C);
    k::gelu_forward(a.fch.f32(), a.fc.f32(), static_cast<int64_t>(BT) * 4 * C);
    if (drop) {
      float* pr = dproj_.f32();
      k::matmul_forward(pr, a.fch.f32(), p(q.mproj_w), p(q.mproj_b), nullptr, BT, 4 * C, C);
      k::dropout_forward_btc(pr, a.mask_mlp.data<uint8_t>(), pr, B, T, C, p_drop_, ctx.seed,
                             mix_stream(ctx.step, a.site_mlp_drop), b.first_sample);
      k::residual_forward(a.x_out.f32(), a.x_attn.f32(), pr, static_cast<int64_t>(BT) * C);
    } else {
      k::matmul_forward(a.x_out.f32(), a.fch.f32(), p(q.mproj_w), p(q.mproj_b), a.x_attn.f32(), BT,
                        4 * C, C);
    }
    x = a.x_out.f32();
    hook(&UnitHooks::after_forward, l + 1);
  }
  hook(&UnitHooks::before_forward, cfg_.n_layer + 1);
  k::layernorm_forward(lnf_.f32(), lnf_mean_.f32(), lnf_rstd_.f32(), x, p(lnf_w_), p(lnf_b_), BT, C,
                       cfg_.ln_eps);
  hook(&UnitHooks::after_forward, cfg_.n_layer + 1);
  k::matmul_nt_forward(logits_.f32(), lnf_.f32(), p(wte_), BT, C, V);
  hook(&UnitHooks::after_forward, 0);
  if (!have_targets_) return 0.0;
  return k::softmax_xent_forward(losses_.f32(), lse_.f32(), logits_.f32(), b.targets, BT, V);
}

void GPT::backward() {
  TESSERA_CHECK(B_ > 0, "backward() without a preceding forward()");
  TESSERA_CHECK(have_targets_, "backward() needs a forward() with targets");
  const int B = B_, T = T_, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size;
  const int BT = B * T;
  const int64_t n_btc = static_cast<int64_t>(BT) * C;
  const bool drop = p_drop_ > 0.0f;
  const int32_t* targets = targets_.data<int32_t>();

  hook(&UnitHooks::before_backward, 0);
  float* dlogits = logits_.f32();  // in place
  k::softmax_xent_backward(dlogits, logits_.f32(), lse_.f32(), targets, loss_scale_, BT, V);
  float* dln = dln_.f32();
  float* dres = dres_.f32();
  k::matmul_nt_backward(dln, g(wte_), dlogits, lnf_.f32(), p(wte_), BT, C, V);
  std::memset(dres, 0, sizeof(float) * n_btc);
  const float* x_last = la_.back().x_out.f32();
  hook(&UnitHooks::before_backward, cfg_.n_layer + 1);
  k::layernorm_backward(dres, g(lnf_w_), g(lnf_b_), dln, x_last, p(lnf_w_), lnf_mean_.f32(),
                        lnf_rstd_.f32(), BT, C);
  hook(&UnitHooks::after_backward, cfg_.n_layer + 1);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const LayerParams& q = lp_[l];
    LayerActs& a = la_[l];
    hook(&UnitHooks::before_backward, l + 1);
    const float* x_in = l == 0 ? x0_.f32() : la_[l - 1].x_out.f32();
    // MLP branch: x_out = x_attn + dropout(fch W + b).
    const float* dy = dres;
    if (drop) {
      k::dropout_backward(dproj_.f32(), dres, a.mask_mlp.data<uint8_t>(), n_btc, p_drop_);
      dy = dproj_.f32();
    }
    float* dfch = dfch_.f32();
    k::matmul_backward(dfch, g(q.mproj_w), g(q.mproj_b), dy, a.fch.f32(), p(q.mproj_w), BT, 4 * C,
                       C);
    k::gelu_backward(dfch, dfch, a.fc.f32(), static_cast<int64_t>(BT) * 4 * C);
    k::matmul_backward(dln, g(q.fc_w), g(q.fc_b), dfch, a.ln2.f32(), p(q.fc_w), BT, C, 4 * C);
    k::layernorm_backward(dres, g(q.ln2_w), g(q.ln2_b), dln, a.x_attn.f32(), p(q.ln2_w),
                          a.ln2_mean.f32(), a.ln2_rstd.f32(), BT, C);
    // Attention branch: x_attn = x_in + dropout(atty W + b).
    dy = dres;
    if (drop) {
      k::dropout_backward(dproj_.f32(), dres, a.mask_attn.data<uint8_t>(), n_btc, p_drop_);
      dy = dproj_.f32();
    }
    k::matmul_backward(datty_.f32(), g(q.aproj_w), g(q.aproj_b), dy, a.atty.f32(), p(q.aproj_w), BT,
                       C, C);
    k::attention_backward(dqkv_.f32(), dscratch_.f32(), datty_.f32(), a.att.f32(),
                          drop ? a.att_drop.f32() : nullptr, a.qkv.f32(), B, T, C, NH, p_drop_);
    k::matmul_backward(dln, g(q.attn_w), g(q.attn_b), dqkv_.f32(), a.ln1.f32(), p(q.attn_w), BT, C,
                       3 * C);
    k::layernorm_backward(dres, g(q.ln1_w), g(q.ln1_b), dln, x_in, p(q.ln1_w), a.ln1_mean.f32(),
                          a.ln1_rstd.f32(), BT, C);
    hook(&UnitHooks::after_backward, l + 1);
  }
  if (drop) k::dropout_backward(dres, dres, mask_emb_.data<uint8_t>(), n_btc, p_drop_);
  k::embedding_backward(g(wte_), g(wpe_), dres, tokens_.data<int32_t>(), B, T, C);
  hook(&UnitHooks::after_backward, 0);
}

const float* GPT::logits() const {
  return logits_.f32();
}
const float* GPT::losses() const {
  return losses_.f32();
}

int64_t GPT::num_params_without_wpe() const {
  return params_.global_numel() - params_.infos()[wpe_].global_numel();
}

double GPT::flops_per_token(int T) const {
  return 6.0 * static_cast<double>(num_params_without_wpe()) +
         12.0 * cfg_.n_layer * static_cast<double>(cfg_.n_embd) * T;
}

std::string GPT::first_non_finite() const {
  auto bad = [](const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(x[i])) return true;
    return false;
  };
  // Parameters first: a bad weight is the cause, bad gradients and activations its effects.
  // (Pointers are null where a ZeRO engine holds no full copy.)
  for (int i = 0; i < params_.size(); ++i) {
    const float* w = params_.param_data(i);
    if (w && bad(w, params_.infos()[i].local_numel())) return params_.infos()[i].name;
  }
  for (int i = 0; i < params_.size(); ++i) {
    const float* d = params_.grad_data(i);
    if (d && bad(d, params_.infos()[i].local_numel()))
      return params_.infos()[i].name + " (gradient)";
  }
  if (B_ == 0) return "";
  const int64_t BT = static_cast<int64_t>(B_) * T_;
  for (const NamedAct& a : acts_) {
    // Attention probabilities are meaningful on the causal triangle only: check row by row.
    if (a.width == 0) {
      const int64_t rows = BT * cfg_.n_head;  // (b, h, t)
      for (int64_t r = 0; r < rows; ++r)
        if (bad(a.t.f32() + r * T_, r % T_ + 1)) return a.name + " (activation)";
      continue;
    }
    if (a.name == "logits" && !have_targets_) continue;
    if (bad(a.t.f32(), BT * a.width)) return a.name + " (activation)";
  }
  return "";
}

}  // namespace tessera::nn
