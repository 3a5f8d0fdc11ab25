// GPT-2 (Radford et al. 2019) with explicit forward and backward on one rank: learned positions,
// pre-LayerNorm blocks (ln_1 -> attn -> +, ln_2 -> mlp -> +), final ln_f, LM head tied to wte.
// Parameters carry Hugging Face GPT2Model names and layouts ("h.3.attn.c_attn.weight" [C, 3C]).
//
// Initialisation (GPT-2's scheme, drawn from philox(seed, stable_hash(name), global index) by
// ParameterSet::initialize): weights normal(0, 0.02); attn.c_proj.weight and mlp.c_proj.weight
// normal(0, 0.02 / sqrt(2 * n_layer)); wpe normal(0, 0.01) as in OpenAI's released GPT-2 code
// (Hugging Face and nanoGPT use 0.02); biases 0; LayerNorm gains 1.
//
// Dropout sites (HF module names) and their streams, mix_stream(step, stable_hash(site)):
//   "drop" on the embedding sum, "h.<l>.attn.attn_dropout" on attention probabilities,
//   "h.<l>.attn.resid_dropout" and "h.<l>.mlp.dropout" on the two residual branches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/unit_hooks.h"

namespace tessera::nn {

// How the parameters are laid out in memory (parallel engines choose this; defaults = one rank).
struct GPTLayout {
  // Each unit (embeddings, each block, ln_f) starts at a multiple of this many floats.
  int64_t unit_alignment = 16;
  // Allocate the full flat parameter / gradient buffers (ZeRO-3 / ZeRO-2 do not).
  bool full_params = true;
  bool full_grads = true;
};

class GPT {
 public:
  // Validates cfg, registers and materialises the parameters (zero until initialize()), and
  // allocates activations for (max_batch, block_size) once, in the Activations category.
  GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout = {});
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  void initialize(uint64_t seed);  // GPT-2 initialisation (see above)
  const GPTConfig& config() const { return cfg_; }
  int max_batch() const { return max_batch_; }
  ParameterSet& params() { return params_; }
  // Units for parallel engines (see unit_hooks.h): 0 = embeddings, 1..L = blocks, L+1 = ln_f.
  int num_units() const { return cfg_.n_layer + 2; }
  // Flat offset where unit u's parameters start; unit_begin(num_units()) = params().numel().
  int64_t unit_begin(int u) const { return unit_begin_[u]; }
  // Callbacks around each unit's forward and backward (null: none).
  void set_hooks(UnitHooks* hooks) { hooks_ = hooks; }
  const ParameterSet& params() const { return params_; }

  // Runs the model on b (B <= max_batch, T <= block_size; token ids are checked) and saves the
  // activations for backward(). Returns the SUM of the token cross-entropies (nats) over targets
  // that are not -1, or 0 when b.targets is null (inference).
  double forward(const Batch& b, const StepContext& ctx);
  // ACCUMULATES d(loss_scale * sum of losses)/d(param) into params().grad(...). Needs the
  // preceding forward() with targets. Overwrites the logits buffer with dlogits.
  void backward();

  // [B, T, V] logits of the last forward(); valid until backward() (which reuses the buffer).
  const float* logits() const;
  // Per-token losses [B, T] of the last forward() with targets (0 where the target is -1).
  const float* losses() const;

  int64_t num_params_without_wpe() const;  // global parameter count minus wpe (PaLM's N)
  double flops_per_token(int T) const;     // 6 N + 12 L C T (PaLM, forward + backward)

  // The first parameter, gradient or activation of the last forward holding a NaN/Inf, e.g.
  // "h.2.mlp.c_fc.weight (gradient)" or "h.0.qkv (activation)"; "" if all are finite.
  std::string first_non_finite() const;

 private:
  struct LayerParams {
    int ln1_w, ln1_b, attn_w, attn_b, aproj_w, aproj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w, mproj_b;
  };
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, att, att_drop, atty, x_attn, ln2, ln2_mean, ln2_rstd, fc,
        fch, x_out;
    Tensor mask_attn, mask_mlp;  // U8 residual-dropout masks (only with dropout)
    uint64_t site_attn_drop, site_resid_drop, site_mlp_drop;
  };
  struct NamedAct {
    std::string name;
    Tensor t;
    int64_t width;  // elements per token; 0: attention probabilities [B, NH, T, T]
  };

  float* p(int i) const { return params_.param_data(i); }
  float* g(int i) const { return params_.grad_data(i); }
  void hook(void (UnitHooks::*f)(int), int unit) {
    if (hooks_) (hooks_->*f)(unit);
  }
  Tensor act(const std::string& name, int64_t width, DType dt = DType::F32);
  void check_batch(const Batch& b) const;

  GPTConfig cfg_;
  int max_batch_;
  Allocator& alloc_;
  ParameterSet params_;
  int wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<LayerParams> lp_;
  std::vector<int64_t> unit_begin_;
  UnitHooks* hooks_ = nullptr;

  std::vector<NamedAct> acts_;
  std::vector<LayerActs> la_;
  Tensor x0_, mask_emb_, lnf_, lnf_mean_, lnf_rstd_, logits_, lse_, losses_;
  Tensor tokens_, targets_;  // I32 copies of the last batch
  // Backward workspace (activation gradients; reused by every layer).
  Tensor dres_, dln_, datty_, dqkv_, dfch_, dproj_, dscratch_;
  uint64_t site_emb_drop_;

  // State of the last forward.
  int B_ = 0, T_ = 0;
  bool have_targets_ = false;
  float p_drop_ = 0.0f;  // dropout probability in effect (0 in eval mode)
  float loss_scale_ = 1.0f;
};

}  // namespace tessera::nn
