// A block's attention branch as a module interface: x_attn = x + attn(norm(x)) on this rank's rows
// of the residual stream. GPT-2's (Attention, nn/attention.h: LayerNorm, fused c_attn, learned
// positions elsewhere) and the Llama family's (RotaryAttention, nn/rotary_attention.h: RMSNorm,
// q/k/v projections, rotary embeddings, grouped-query heads) are its two kinds; a Block holds one
// (nn/block.h), so a new kind of attention is a new module, not a branch in the block.
//
// The contract (the one nn/mlp.h keeps too): forward/backward run over an AttentionRecord the
// caller owns, one per micro-batch in flight (make_record); parameter gradients ACCUMULATE; under
// selective recomputation the attention core's output (atty and its log-sum-exp) lives in the
// workspace and the core reruns from the kept qkv in the backward; under full recomputation the
// record keeps nothing and the block reruns the forward into the workspace's record (recompute)
// just before the backward; the zero-bubble split (defer) leaves the matmuls' weight gradients in
// the record's Deferred for backward_weight.
//
// The attention core is the fused kernel (kernels/flash_attention.h) for both kinds, run here
// (core_forward, core_backward): no [B, heads, T, T] tensor is held, only each query row's
// log-sum-exp, from which the backward recomputes the probabilities tile by tile. A micro-batch
// whose sequences are split over the context-parallel group (BlockPass::split) runs it as the
// context-parallel attention instead (nn/context_parallel_attention.h: all-gather, ring or
// Ulysses), the only exchange between the cp ranks of a block's attention.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/kernels/attention.h"
#include "tessera/nn/activations.h"
#include "tessera/nn/block_workspace.h"
#include "tessera/nn/context_parallel.h"
#include "tessera/nn/context_parallel_attention.h"
#include "tessera/nn/gpt_config.h"

namespace tessera::nn {

struct AttentionRecord {
  // "rows": this rank's rows of the B*T tokens; "every token": B*T rows of this rank's columns.
  // (B): BF16 under bf16 GEMM inputs, else F32. Empty where the recompute mode drops them.
  Tensor ln1, ln1_mean, ln1_rstd;  // rows x C (B), rows, rows: the norm's output and statistics
  Tensor qkv;   // every token x qkv width: this rank's q, k and v columns (rotated, where rotary)
  Tensor atty;  // every token x C_local (heads concatenated), F32: the fused backward's row term
                // (flash_attention_delta) reads it besides c_proj's weight gradient
  Tensor lse;   // F32 [B, heads_local, T]: each query row's log-sum-exp (the fused forward's)
  Tensor mask;  // U8 rows x C: the branch output's dropout mask (GPT-2)
  // Zero-bubble split (BI now, W later): the two matmuls' output gradients, and their inputs where
  // the record does not keep them whole (the norm's output under full recomputation or sequence
  // parallelism, atty under full recomputation).
  struct Deferred {
    Tensor d_proj, d_attn, ln1, atty;
    int64_t tokens = 0;  // the B * T they are sized for
  };
  std::shared_ptr<Deferred> deferred;
};

class AttentionBranch {
 public:
  virtual ~AttentionBranch() = default;

  // The activations this module's recompute mode keeps for a micro-batch of up to max_batch
  // sequences (None: all; Selective: all but the core's output, atty and lse; Full: none); `list`
  // (optional) collects the F32 ones by name.
  AttentionRecord make_record(int max_batch, Allocator& alloc,
                              std::vector<NamedActivation>* list = nullptr) const;
  // Adds to the stage's workspace what this module needs, if absent: the core backward's scratch
  // and the recomputation record (Selective: the core's output; Full: every activation, in fp32).
  void reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const;
  // ASSIGNS y[rows, C] = x + attention branch(x); x unchanged until backward. The recompute mode
  // decides where the activations go (the record, or the workspace's: attention_branch.cc), the
  // kind computes them (run_forward).
  void forward(const BlockPass& mb, const float* x, float* y, AttentionRecord& r,
               BlockWorkspace& ws) const;
  // Full recomputation: the forward again, into the workspace's record (y null: without the
  // output projection and residual, only what the backward needs).
  void recompute(const BlockPass& mb, const float* x, float* y, BlockWorkspace& ws) const;
  // Given dres[rows, C] = dL/dy, overwrites it with dL/dx and ACCUMULATES the gradients. defer
  // (zero-bubble BI): only the norm's now; the matmuls' wait in r.deferred for backward_weight.
  void backward(const BlockPass& mb, const float* x, AttentionRecord& r, float* dres,
                BlockWorkspace& ws, bool defer) const;
  virtual void backward_weight(const BlockPass& mb, AttentionRecord& r) const = 0;
  // What a zero-bubble BI keeps for W of a micro-batch of `tokens` tokens (`alloc` null: the
  // current allocator).
  virtual std::shared_ptr<AttentionRecord::Deferred> make_deferred(int64_t tokens,
                                                                   Allocator* alloc) const = 0;
  // Generation with a key/value cache (GPT::decode, nn/gpt.h; one rank, no tensor parallelism):
  // ASSIGNS y[n, C] = x + attention branch(x) for the step's n new tokens, whose attention reads
  // the keys and values of positions [0, pos0) in kv and of the new tokens, which it writes to rows
  // [pos0, pos0 + n) of kv first. No dropout, no record: only the scratch in s and ws.
  virtual void decode(const DecodeStep& step, const float* x, float* y, KvLayer& kv,
                      DecodeScratch& s, BlockWorkspace& ws) const = 0;
  int heads_local() const { return core_.heads.q; }

 protected:
  AttentionBranch(Recompute recompute, const ContextSplit& context)
      : recompute_(recompute), context_(context) {}
  // The record's tensors other than the core's output (the norm's output and statistics, qkv, a
  // mask): `gemm_inputs` the dtype of those only GEMMs read again.
  virtual void allocate_rest(AttentionRecord& r, int max_batch, Allocator& alloc,
                             std::vector<NamedActivation>* list, DType gemm_inputs) const = 0;
  // The kind's forward into r (y null: a recomputation without the output projection).
  virtual void run_forward(const BlockPass& mb, const float* x, float* y, AttentionRecord& r,
                           BlockWorkspace& ws) const = 0;
  // The kind's backward from the activations in r; defer: the matmuls' inputs kept for W.
  virtual void run_backward(const BlockPass& mb, const float* x, const AttentionRecord& r,
                            float* dres, BlockWorkspace& ws,
                            AttentionRecord::Deferred* defer) const = 0;

  // What the attention core needs to know of the kind, set by its constructor: this rank's heads
  // (qkv rows are [q heads | kv heads | kv heads], kernels::AttentionHeads), the global index of
  // its first query head and the global head count (the dropout mask's coordinates), the dropout
  // site, the rows of a sequence a record holds (block_size, or this rank's share of it under
  // context parallelism: ContextSplit::rows_per_sequence), whether bf16 GEMM inputs are kept in
  // bf16 and the layer's activation names' prefix.
  struct Core {
    kernels::AttentionHeads heads;
    int head_offset = 0, n_head = 0;
    uint64_t drop_site = 0;
    int64_t rows_per_sequence = 0;
    bool bf16_gemm_inputs = false;
    std::string prefix;
  };
  // The attention core on qkv[tokens, heads.row_width()]: ASSIGNS atty[tokens, q * size] and
  // lse[B, q, T] (causal, dropout p = mb.p on the probabilities at their global coordinates). A
  // context-parallel core keeps its buffers in ws's dead scratch where they fit (context_call).
  void core_forward(const BlockPass& mb, const float* qkv, float* atty, float* lse,
                    BlockWorkspace& ws) const;
  // Its backward from r's qkv, atty and lse: ASSIGNS dqkv[tokens, heads.row_width()] given
  // datty[tokens, q * size]; ws.delta is its scratch.
  void core_backward(const BlockPass& mb, const AttentionRecord& r, const float* datty, float* dqkv,
                     BlockWorkspace& ws) const;
  // The context-parallel core's call for a split micro-batch, lent ws's d_fc (dead during the
  // core) for the ring's blocks and ws's delta for the backward's row term.
  ContextAttention context_call(const BlockPass& mb, BlockWorkspace& ws) const;
  // The width of this rank's atty (heads x head size).
  int64_t atty_width() const { return int64_t{core_.heads.q} * core_.heads.size; }
  // The record's zero-bubble copies for a micro-batch of mb's size (made on first use).
  AttentionRecord::Deferred& deferred_for(const BlockPass& mb, AttentionRecord& r) const;

  Recompute recompute_;
  // The group a split micro-batch's sequences are split over: the core then runs as
  // nn/context_parallel_attention.h (its comm says how).
  ContextSplit context_;
  Core core_;

 private:
  // The core's output of a record for up to max_batch sequences: atty and lse, fp32.
  void allocate_core(AttentionRecord& r, int max_batch, Allocator& alloc,
                     std::vector<NamedActivation>* list) const;
};

}  // namespace tessera::nn
