// The experts of a mixture (nn/moe.h) as one module per kind of expert MLP: their parameters (this
// rank's local experts, registered in the expert parameter set under their global names) and
// their work on a block of routed rows, which the mixture orders, exchanges and combines whatever
// the kind. GPT-2's experts are GELU MLPs of 4C (GeluExperts: c_fc and c_proj with biases, Conv1D
// layout [in, out]); the Llama family's are SwiGLU MLPs of their own width F = moe_hidden()
// (SwigluExperts: gate, up and down in nn.Linear layout [out, in], no biases), with Mixtral's or
// Qwen2-MoE's names (moe_names).
//
// A row keeps two activations for the backward: `act` (GELU: fc, F wide; SwiGLU: gate | up, 2F)
// and `hid` (GELU: gelu(fc); SwiGLU: silu(gate) * up; F wide each).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/nn/gpt_config.h"
#include "tessera/nn/parameters.h"

namespace tessera::nn {

// The Hugging Face names of an MoE block's parameters, by family:
//   GPT-2      h.<l>.mlp.router.weight [C, E]            h.<l>.mlp.experts.<e>.c_fc.weight ...
//   Mixtral    model.layers.<l>.block_sparse_moe.gate.weight [E, C]
//              model.layers.<l>.block_sparse_moe.experts.<e>.w1 (gate), w3 (up), w2 (down)
//   Qwen2-MoE  model.layers.<l>.mlp.gate.weight [E, C]   model.layers.<l>.mlp.experts.<e>.
//              {gate,up,down}_proj.weight; mlp.shared_expert.{gate,up,down}_proj.weight,
//              mlp.shared_expert_gate.weight [1, C]
// and the selection bias of auxiliary-loss-free balancing, DeepSeek-V3's name beside the router:
// "<router>.e_score_correction_bias" [E] (state, not a parameter: train/moe_bias.h).
struct MoeNames {
  std::string router;      // the router's weight
  std::string score_bias;  // the selection bias
  std::string prefix;      // "h.<l>.mlp.", "model.layers.<l>.block_sparse_moe.", ...
  // Expert e's matrix: "gate", "up" or "down" (the Llama family), "c_fc" or "c_proj" (GPT-2),
  // without ".weight".
  std::string expert(int e, const std::string& which) const;
  std::string shared(const std::string& which) const;  // the shared expert's gate, up, down
  std::string shared_gate() const;                     // its sigmoid gate's weight
  bool mixtral = false;
};
MoeNames moe_names(const GPTConfig& cfg, int layer);

class ExpertMlps {
 public:
  virtual ~ExpertMlps() = default;
  virtual int64_t act_width() const = 0;
  virtual int64_t hid_width() const = 0;
  // The scratch backward_data needs per row (SwiGLU: dL/d hid).
  virtual int64_t scratch_width() const = 0;
  // Forward matmul FLOPs of one row (the mixture cuts its work into pieces by it).
  virtual int64_t flops_per_row() const = 0;
  // The bf16 copies of the local experts' weights (a bf16 model's; read by every row block).
  virtual void refresh_bf16_copies() const = 0;

  // Local expert el on `rows` rows of in[rows, C]: ASSIGNS act, hid and out[rows, C].
  virtual void forward(int el, int64_t rows, const float* in, float* act, float* hid,
                       float* out) const = 0;
  // The input side of its backward given dy[rows, C]: ASSIGNS dact[rows, act_width] and
  // dx[rows, C]; act is the forward's (left as it was).
  virtual void backward_data(int el, int64_t rows, const float* act, const float* dy, float* dact,
                             float* dx, float* scratch) const = 0;
  // Its weight (and bias) gradients from one block of rows (ACCUMULATED).
  virtual void backward_weights(int el, int64_t rows, const float* in, const float* hid,
                                const float* dy, const float* dact) const = 0;
};

// Registers `count` local experts from global index `first` of block `layer` in `experts`: GELU
// MLPs for GPT-2, SwiGLU MLPs for the Llama family.
std::unique_ptr<ExpertMlps> make_expert_mlps(ParameterSet& experts, const GPTConfig& cfg, int layer,
                                             int first, int count);

}  // namespace tessera::nn
