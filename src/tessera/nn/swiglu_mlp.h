// The Llama family's MLP branch as a module (an Mlp, nn/mlp.h):
//   y = x + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = RMSNorm(x),
// with Hugging Face names "model.layers.<l>.post_attention_layernorm.weight" and
// "model.layers.<l>.mlp.{gate,up,down}_proj.weight" in nn.Linear layout [out, in], hidden width
// cfg.mlp_hidden() (F), no biases and no dropout (as Hugging Face's LlamaMLP).
//
// Tensor parallelism: this rank holds F / t hidden columns: the rows of gate and up (column-
// parallel, the input gathered once for both under sequence parallelism) and the columns of down
// (row-parallel). The record keeps the norm's output (this rank's rows), gate and up side by side
// (fp32: the SwiGLU backward reads them) and their product h (bf16 under bf16 GEMM inputs). The
// backward turns the kept gate|up into their gradients in place (they are not read again).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/nn/context_parallel.h"
#include "tessera/nn/linear.h"
#include "tessera/nn/mlp.h"

namespace tessera::nn {

struct SwigluMlpRecord final : MlpRecord {
  Tensor ln2, ln2_rstd;  // rows x C (B), rows
  Tensor gu;             // every token x 2 F_local: gate | up
  Tensor h;              // every token x F_local: silu(gate) * up (B)
  // Zero-bubble split: the matmuls' output gradients, and the inputs the record does not keep
  // whole (the norm's output under full recomputation or sequence parallelism, h under full).
  struct Deferred {
    Tensor d_down, d_gu, ln2, h;
    int64_t tokens = 0;
  };
  std::shared_ptr<Deferred> deferred;
};

class SwigluMlp final : public Mlp {
 public:
  // `context`: its records hold context.rows_per_sequence(block_size) rows of each sequence.
  SwigluMlp(ParameterSet& ps, const GPTConfig& cfg, int layer, const TensorSplit& split,
            const ContextSplit& context, Recompute recompute, bool bf16_gemm_inputs);

  const char* kind() const override { return "swiglu"; }
  std::unique_ptr<MlpRecord> make_record(int max_batch, Allocator& alloc,
                                         std::vector<NamedActivation>* list) const override;
  void reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const override;
  void forward(const BlockPass& mb, const float* x, float* y, MlpRecord& r,
               BlockWorkspace& ws) const override;
  void recompute(const BlockPass& mb, const float* x, BlockWorkspace& ws) const override;
  void backward(const BlockPass& mb, const float* x, MlpRecord& r, float* dres, BlockWorkspace& ws,
                bool defer) const override;
  void backward_weight(const BlockPass& mb, MlpRecord& r) const override;
  size_t deferred_bytes(int64_t tokens) const override;

  int64_t hidden_local() const { return hidden_local_; }

 private:
  void allocate(SwigluMlpRecord& r, int max_batch, Allocator& alloc,
                std::vector<NamedActivation>* list, DType gemm_inputs) const;
  void run_forward(const BlockPass& mb, const float* x, float* y, SwigluMlpRecord& r,
                   BlockWorkspace& ws) const;
  void run_backward(const BlockPass& mb, const float* x, SwigluMlpRecord& r, float* dres,
                    BlockWorkspace& ws, SwigluMlpRecord::Deferred* defer) const;
  SwigluMlpRecord::Deferred& deferred_for(const BlockPass& mb, SwigluMlpRecord& r) const;
  std::shared_ptr<SwigluMlpRecord::Deferred> make_deferred(int64_t tokens, Allocator* alloc) const;
  SwigluMlpRecord& scratch(BlockWorkspace& ws) const;

  const ParameterSet& ps_;
  GPTConfig cfg_;
  int layer_;
  TensorSplit split_;
  Recompute recompute_;
  bool bf16_gemm_inputs_;
  int64_t rows_per_sequence_;  // of a record (ContextSplit::rows_per_sequence)
  int64_t hidden_local_;
  int norm_ = -1;
  Linear gate_, up_, down_;
};

}  // namespace tessera::nn
