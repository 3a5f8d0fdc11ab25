// GPT-2's attention branch of a block as a module: x_attn = x + dropout(attn(ln_1(x)) W_proj + b),
// with HF names "h.<l>.ln_1.*", "h.<l>.attn.c_attn.*", "h.<l>.attn.c_proj.*". Causal multi-head
// self-attention with dropout on the probabilities ("h.<l>.attn.attn_dropout") and on the branch
// output ("h.<l>.attn.resid_dropout"). forward/backward run over a record the caller owns (one per
// micro-batch in flight); parameter gradients ACCUMULATE.
//
// Tensor parallelism: this rank holds n_head / t heads, c_attn's columns of them (the same columns
// of q, k and v) and c_proj's rows (column_linear / row_linear, nn/linear.h). Under sequence
// parallelism ln_1, the dropout and the residual add run on this rank's rows; the record keeps only
// those rows of ln_1's output and the backward all-gathers them again for c_attn's weight gradient.
//
// The attention core is the fused kernel (AttentionBranch::core_forward: no [B, heads, T, T]
// tensor; the record keeps each query row's log-sum-exp). Recomputation: the record keeps
// everything (None), everything but the core's output atty and its log-sum-exp (Selective: they go
// to the workspace and the core reruns from the kept qkv in the backward), or nothing (Full: the
// block reruns the forward into the workspace before the backward, see Block).
//
// bf16 GEMM inputs (decision 33): ln_1's output, read again only by a bf16 GEMM, is kept in bf16
// (computed in fp32 scratch first, so the numbers are those of fp32 records); atty stays fp32, as
// the fused backward's row term reads it. The zero-bubble split keeps the two matmuls' output
// gradients (and the inputs the record lacks) for backward_weight.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/nn/activations.h"
#include "tessera/nn/attention_branch.h"
#include "tessera/nn/block_workspace.h"
#include "tessera/nn/linear.h"

namespace tessera::nn {

class Attention final : public AttentionBranch {
 public:
  Attention(ParameterSet& ps, const GPTConfig& cfg, int layer, const TensorSplit& split,
            const ContextSplit& context, Recompute recompute, bool bf16_gemm_inputs);

  void backward_weight(const BlockPass& mb, AttentionRecord& r) const override;
  // What a zero-bubble BI keeps for W of a micro-batch of `tokens` tokens (`alloc` null: the
  // current allocator).
  std::shared_ptr<AttentionRecord::Deferred> make_deferred(int64_t tokens,
                                                           Allocator* alloc) const override;

  // Generation with a key/value cache (see AttentionBranch::decode): ln_1 and c_attn on the new
  // rows, their keys and values into the cache, the attention over the cache, c_proj and the
  // residual.
  void decode(const DecodeStep& step, const float* x, float* y, KvLayer& kv, DecodeScratch& s,
              BlockWorkspace& ws) const override;

  int64_t c_local() const { return c_local_; }

 private:
  void allocate_rest(AttentionRecord& r, int max_batch, Allocator& alloc,
                     std::vector<NamedActivation>* list, DType gemm_inputs) const override;
  void run_forward(const BlockPass& mb, const float* x, float* y, AttentionRecord& r,
                   BlockWorkspace& ws) const override;
  void run_backward(const BlockPass& mb, const float* x, const AttentionRecord& r, float* dres,
                    BlockWorkspace& ws, AttentionRecord::Deferred* defer) const override;

  const ParameterSet& ps_;
  GPTConfig cfg_;
  int layer_;
  TensorSplit split_;
  int heads_local_;
  int64_t c_local_;
  int ln_w_ = -1, ln_b_ = -1;
  Linear c_attn_, c_proj_;
  uint64_t site_resid_drop_;
};

}  // namespace tessera::nn
