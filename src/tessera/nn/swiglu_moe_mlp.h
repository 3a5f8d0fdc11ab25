// The Llama family's mixture-of-experts MLP branch (an Mlp, nn/mlp.h; decision 30):
//   y = x + moe(n) + g * shared(n),   n = RMSNorm(x) (post_attention_layernorm),
// where moe is the router and SwiGLU experts of nn/moe.h, shared (optional) a SwiGLU MLP of
// moe.shared_ffn_dim that every token passes through, and g = sigmoid(n . w_gate) its gate
// (Qwen2-MoE's shared_expert_gate; g = 1 without moe.shared_gate). No biases, no dropout (as
// Hugging Face's MixtralSparseMoeBlock and Qwen2MoeSparseMoeBlock). Names (moe_experts.h):
// Mixtral's "model.layers.<l>.block_sparse_moe.*" or Qwen2-MoE's "model.layers.<l>.mlp.*".
//
// Tensor parallelism: the routed experts are whole on every tp rank, which runs the whole mixture
// on its complete input (as GPT-2's MoeMlp); the shared expert is a dense SwiGLU MLP and is split
// like one (SwigluMlp): gate and up by rows, down by columns, its partial output summed over the
// group (all-reduce, or reduce-scatter into this rank's rows under sequence parallelism) and its
// input gradient likewise. The gate's weight [1, C] is replicated; its gradient is complete on
// every tp rank, or (sequence parallelism) each rank's rows' part, summed like the norm's.
// Under sequence parallelism the norm's rows are all-gathered in fp32 into the record (the router
// reads fp32), which keeps every token; the shared expert reads the same gathered input.
//
// Everything is computed in backward (also under the zero-bubble split); under full recomputation
// the forward, exchanges included, reruns before the backward.
#pragma once

#include <memory>
#include <vector>

#include "tessera/nn/linear.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/moe.h"

namespace tessera::nn {

struct SwigluMoeMlpRecord final : MlpRecord {
  Tensor ln2;       // fp32: rows x C, or every token (padded rows) under sequence parallelism
  Tensor ln2_rstd;  // rows
  std::shared_ptr<MixtureOfExperts::Record> moe;  // the router's and experts' activations
  // The shared expert: every token's gate | up (this rank's 2 Fs / t columns), their product, the
  // gate g per token, and this rank's rows of its (reduced) output (a gated one's backward).
  Tensor gu, h, gate, shared;
};

class SwigluMoeMlp final : public Mlp {
 public:
  // Registers the norm, the router and the shared expert in `ps`, this rank's experts in
  // `experts`.
  SwigluMoeMlp(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
               const TensorSplit& split, ExpertSplit expert_split, const ContextSplit& context,
               Recompute recompute);

  const char* kind() const override { return "swiglu_moe"; }
  std::unique_ptr<MlpRecord> make_record(int max_batch, Allocator& alloc,
                                         std::vector<NamedActivation>* list) const override;
  void reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const override;
  void forward(const BlockPass& mb, const float* x, float* y, MlpRecord& r,
               BlockWorkspace& ws) const override;
  void recompute(const BlockPass& mb, const float* x, BlockWorkspace& ws) const override;
  void backward(const BlockPass& mb, const float* x, MlpRecord& r, float* dres, BlockWorkspace& ws,
                bool defer) const override;
  void backward_weight(const BlockPass& mb, MlpRecord& r) const override;
  size_t deferred_bytes(int64_t) const override { return 0; }  // nothing is deferred
  const MixtureOfExperts* experts() const override { return &moe_; }

 private:
  void allocate(SwigluMoeMlpRecord& r, int max_batch, Allocator& alloc,
                std::vector<NamedActivation>* list) const;
  void run_forward(const BlockPass& mb, const float* x, float* y, SwigluMoeMlpRecord& r,
                   BlockWorkspace& ws) const;
  void run_backward(const BlockPass& mb, const float* x, SwigluMoeMlpRecord& r, float* dres,
                    BlockWorkspace& ws) const;
  SwigluMoeMlpRecord& scratch(BlockWorkspace& ws) const;
  bool shared() const { return shared_local_ > 0; }

  const ParameterSet& ps_;
  GPTConfig cfg_;
  int layer_;
  TensorSplit split_;
  Recompute recompute_;
  int64_t rows_per_sequence_;  // of a record (ContextSplit::rows_per_sequence)
  int norm_ = -1;
  MixtureOfExperts moe_;
  int64_t shared_local_ = 0;  // the shared expert's hidden columns on this rank (0: none)
  Linear s_gate_, s_up_, s_down_;
  int gate_w_ = -1;  // the shared expert's sigmoid gate [1, C], or -1
};

}  // namespace tessera::nn
