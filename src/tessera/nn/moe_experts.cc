#include "tessera/nn/moe_experts.h"

#include <cmath>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/swiglu.h"
#include "tessera/nn/linear.h"

namespace tessera::nn {

namespace k = tessera::kernels;

std::string MoeNames::expert(int e, const std::string& which) const {
  std::string m = which;
  if (mixtral)
    m = which == "gate" ? "w1" : which == "up" ? "w3" : "w2";
  else if (which == "gate" || which == "up" || which == "down")
    m = which + "_proj";
  return prefix + "experts." + std::to_string(e) + "." + m;
}

std::string MoeNames::shared(const std::string& which) const {
  return prefix + "shared_expert." + which + "_proj";
}

std::string MoeNames::shared_gate() const {
  return prefix + "shared_expert_gate.weight";
}

MoeNames moe_names(const GPTConfig& cfg, int layer) {
  MoeNames n;
  const std::string l = std::to_string(layer);
  if (!cfg.llama()) {
    n.prefix = "h." + l + ".mlp.";
    n.router = n.prefix + "router.weight";
    n.score_bias = n.prefix + "router.e_score_correction_bias";
    return n;
  }
  n.mixtral = cfg.hf_type() == "mixtral";
  n.prefix = "model.layers." + l + (n.mixtral ? ".block_sparse_moe." : ".mlp.");
  n.router = n.prefix + "gate.weight";
  n.score_bias = n.prefix + "gate.e_score_correction_bias";
  return n;
}

namespace {

// GPT-2's experts: fc = in W_fc + b, fch = gelu(fc), out = fch W_proj + b (Conv1D layout).
class GeluExperts final : public ExpertMlps {
 public:
  GeluExperts(ParameterSet& eps, const GPTConfig& cfg, int layer, int first, int count)
      : eps_(eps), C_(cfg.n_embd), F_(4 * static_cast<int64_t>(cfg.n_embd)) {
    const float proj_std = kInitStd / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
    const MoeNames names = moe_names(cfg, layer);
    for (int el = 0; el < count; ++el) {
      const int e = first + el;
      Params p;
      p.fc_w = eps.add(names.expert(e, "c_fc") + ".weight", {C_, F_}, Init::Normal, kInitStd, true);
      p.fc_b = eps.add(names.expert(e, "c_fc") + ".bias", {F_}, Init::Zeros, 0.0f, false);
      p.proj_w =
          eps.add(names.expert(e, "c_proj") + ".weight", {F_, C_}, Init::Normal, proj_std, true);
      p.proj_b = eps.add(names.expert(e, "c_proj") + ".bias", {C_}, Init::Zeros, 0.0f, false);
      eps.mark_gemm_weight(p.fc_w);
      eps.mark_gemm_weight(p.proj_w);
      experts_.push_back(p);
    }
  }
  int64_t act_width() const override { return F_; }
  int64_t hid_width() const override { return F_; }
  int64_t scratch_width() const override { return 0; }
  int64_t flops_per_row() const override { return 16 * C_ * C_; }
  void refresh_bf16_copies() const override {
    for (const Params& q : experts_) {
      eps_.refresh_bf16_copy(q.fc_w);
      eps_.refresh_bf16_copy(q.proj_w);
    }
  }
  void forward(int el, int64_t rows, const float* in, float* fc, float* fch,
               float* out) const override {
    const Params& q = experts_[static_cast<size_t>(el)];
    const int C = static_cast<int>(C_), F = static_cast<int>(F_), M = static_cast<int>(rows);
    k::matmul_forward(fc, in, eps_.gemm_weight(q.fc_w), eps_.param_data(q.fc_b), nullptr, M, C, F);
    k::gelu_forward(fch, fc, rows * F_);
    k::matmul_forward(out, fch, eps_.gemm_weight(q.proj_w), eps_.param_data(q.proj_b), nullptr, M,
                      F, C);
  }
  void backward_data(int el, int64_t rows, const float* fc, const float* dy, float* dfc, float* dx,
                     float*) const override {
    const Params& q = experts_[static_cast<size_t>(el)];
    const int C = static_cast<int>(C_), F = static_cast<int>(F_), M = static_cast<int>(rows);
    k::matmul_backward(dfc, nullptr, nullptr, dy, nullptr, eps_.gemm_weight(q.proj_w), M, F, C);
    k::gelu_backward(dfc, dfc, fc, rows * F_);
    k::matmul_backward(dx, nullptr, nullptr, dfc, nullptr, eps_.gemm_weight(q.fc_w), M, C, F);
  }
  void backward_weights(int el, int64_t rows, const float* in, const float* fch, const float* dy,
                        const float* dfc) const override {
    const Params& q = experts_[static_cast<size_t>(el)];
    const int C = static_cast<int>(C_), F = static_cast<int>(F_), M = static_cast<int>(rows);
    k::matmul_backward(nullptr, eps_.grad_data(q.proj_w), eps_.grad_data(q.proj_b), dy, fch,
                       nullptr, M, F, C);
    k::matmul_backward(nullptr, eps_.grad_data(q.fc_w), eps_.grad_data(q.fc_b), dfc, in, nullptr, M,
                       C, F);
  }

 private:
  struct Params {
    int fc_w, fc_b, proj_w, proj_b;
  };
  const ParameterSet& eps_;
  int64_t C_, F_;
  std::vector<Params> experts_;
};

// The Llama family's experts: gu = in [W_gate; W_up]^T, h = silu(gate) * up, out = h W_down^T
// (nn.Linear layout, no biases), as SwigluMlp computes a dense MLP on every token.
class SwigluExperts final : public ExpertMlps {
 public:
  SwigluExperts(ParameterSet& eps, const GPTConfig& cfg, int layer, int first, int count)
      : eps_(eps), C_(cfg.n_embd), F_(cfg.moe_hidden()) {
    const MoeNames names = moe_names(cfg, layer);
    for (int el = 0; el < count; ++el) {
      const int e = first + el;
      Params p;
      auto add = [&](Linear& l, const char* which, int64_t out, int64_t in) {
        l.weight =
            eps.add(names.expert(e, which) + ".weight", {out, in}, Init::Normal, kInitStd, true);
        l.in = in, l.out = out, l.transposed = true;
        eps.mark_gemm_weight(l.weight);
      };
      add(p.gate, "gate", F_, C_);
      add(p.up, "up", F_, C_);
      add(p.down, "down", C_, F_);
      experts_.push_back(p);
    }
  }
  int64_t act_width() const override { return 2 * F_; }
  int64_t hid_width() const override { return F_; }
  int64_t scratch_width() const override { return F_; }
  int64_t flops_per_row() const override { return 6 * C_ * F_; }
  void refresh_bf16_copies() const override {
    for (const Params& q : experts_)
      for (const Linear* l : {&q.gate, &q.up, &q.down}) eps_.refresh_bf16_copy(l->weight);
  }
  void forward(int el, int64_t rows, const float* in, float* gu, float* h,
               float* out) const override {
    const Params& q = experts_[static_cast<size_t>(el)];
    linear_forward(eps_, q.gate, gu, 2 * F_, in, rows);
    linear_forward(eps_, q.up, gu + F_, 2 * F_, in, rows);
    k::swiglu_forward(h, gu, gu + F_, rows, F_, 2 * F_);
    linear_forward(eps_, q.down, out, C_, h, rows);
  }
  void backward_data(int el, int64_t rows, const float* gu, const float* dy, float* dgu, float* dx,
                     float* dh) const override {
    const Params& q = experts_[static_cast<size_t>(el)];
    linear_backward(eps_, q.down, dh, false, nullptr, nullptr, dy, C_, nullptr, rows);
    k::swiglu_backward(dgu, dgu + F_, dh, gu, gu + F_, rows, F_, 2 * F_);
    linear_backward(eps_, q.gate, dx, false, nullptr, nullptr, dgu, 2 * F_, nullptr, rows);
    linear_backward(eps_, q.up, dx, true, nullptr, nullptr, dgu + F_, 2 * F_, nullptr, rows);
  }
  void backward_weights(int el, int64_t rows, const float* in, const float* h, const float* dy,
                        const float* dgu) const override {
    const Params& q = experts_[static_cast<size_t>(el)];
    linear_backward(eps_, q.down, nullptr, false, eps_.grad_data(q.down.weight), nullptr, dy, C_, h,
                    rows);
    linear_backward(eps_, q.gate, nullptr, false, eps_.grad_data(q.gate.weight), nullptr, dgu,
                    2 * F_, in, rows);
    linear_backward(eps_, q.up, nullptr, false, eps_.grad_data(q.up.weight), nullptr, dgu + F_,
                    2 * F_, in, rows);
  }

 private:
  struct Params {
    Linear gate, up, down;
  };
  const ParameterSet& eps_;
  int64_t C_, F_;
  std::vector<Params> experts_;
};

}  // namespace

std::unique_ptr<ExpertMlps> make_expert_mlps(ParameterSet& experts, const GPTConfig& cfg, int layer,
                                             int first, int count) {
  if (cfg.llama()) return std::make_unique<SwigluExperts>(experts, cfg, layer, first, count);
  return std::make_unique<GeluExperts>(experts, cfg, layer, first, count);
}

}  // namespace tessera::nn
