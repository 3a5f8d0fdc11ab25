// A transformer block as a short composition of two modules: x -> x_attn = attention branch(x)
// (norm, attention, dropout, +) -> y = Mlp(x_attn) (norm, MLP, dropout, +). GPT-2's branches are
// Attention and GeluMlp (or, in a mixture-of-experts block, cfg.moe.is_moe_layer(layer), a MoeMlp);
// the Llama family's RotaryAttention and SwigluMlp (cfg.arch). The modules own their
// parameters ("h.<l>.ln_1.weight", "h.<l>.attn.c_attn.weight", ...), records, tensor- and
// sequence-parallel split and bf16 GEMM inputs (nn/attention.h, nn/mlp.h); the block keeps the
// residual stream between them and orders a full recomputation. forward/backward run over a Record
// the caller owns (one per micro-batch in flight); parameter gradients ACCUMULATE.
//
// Halves (BlockPart): a pipeline stage may end after a block's attention (x -> x_attn) and the next
// begin with its MLP (x_attn -> y), so that stages balance at a finer grain than whole blocks. Such
// a block holds only the one module: its parameters and activations; the two halves' forward and
// backward are the whole block's, operation for operation.
//
// Activation recomputation (gpt_config.h): the modules keep everything (None), everything but the
// attention core's output (Selective: the fused attention reruns from qkv), or nothing (Full: the
// block reruns both modules' forward into the shared workspace just before its backward, the MLP
// without its output projection); the caller always keeps the block's input alive until its
// backward. Recomputed values go to the shared BlockWorkspace, so recomputation costs one block's
// activations per stage.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/activations.h"
#include "tessera/nn/attention_branch.h"
#include "tessera/nn/block_workspace.h"
#include "tessera/nn/context_parallel.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/moe.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/tensor_parallel.h"

namespace tessera::nn {

class Block {
 public:
  struct Record {
    std::optional<AttentionRecord> attention;  // blocks and attention halves
    std::unique_ptr<MlpRecord> mlp;            // blocks and MLP halves
    // A whole block's residual stream after the attention, rows x C (not under Full).
    Tensor x_attn;
    // What the forward ran with (a recomputation reruns exactly this).
    const float* x = nullptr;  // the block's (half's) input, owned and kept alive by the caller
    BlockPass pass;
  };
  using Workspace = BlockWorkspace;

  // `split`: the tensor-parallel group; a mixture-of-experts block registers its router in `ps`
  // and this rank's experts of `expert_split` in `experts` (null: in ps); `context`: the group a
  // split micro-batch's sequences are split over (context parallelism, nn/context_parallel.h).
  // bf16_gemm_inputs: keep the GEMM-only inputs in bf16 (a model whose GEMMs are bf16).
  Block(ParameterSet& ps, const GPTConfig& cfg, int layer, TensorSplit split,
        ExpertSplit expert_split, ContextSplit context, Recompute recompute,
        ParameterSet* experts = nullptr, BlockPart part = BlockPart::Whole,
        bool bf16_gemm_inputs = false);
  // A block of whole sequences (its own group of one for the context).
  Block(ParameterSet& ps, const GPTConfig& cfg, int layer, TensorSplit split,
        ExpertSplit expert_split, Recompute recompute, ParameterSet* experts = nullptr,
        BlockPart part = BlockPart::Whole, bool bf16_gemm_inputs = false);

  // Allocates the activations this block's modules keep for one micro-batch of up to max_batch
  // sequences. `list` (optional) collects the F32 ones by name.
  Record make_record(int max_batch, Allocator& alloc,
                     std::vector<NamedActivation>* list = nullptr) const;
  // The scratch shared by the blocks of a stage, with what this block's recomputation needs.
  Workspace make_workspace(int max_batch, Allocator& alloc) const;
  // Adds to a workspace made by another block of the stage what this block needs and it lacks
  // (an MoE block's recomputation record after a dense one's workspace, or the reverse).
  void complete_workspace(Workspace& ws, int max_batch, Allocator& alloc) const;

  // ASSIGNS y[rows, C] = block(x) (of a half: x_attn = attention(x), or y = mlp(x_attn)).
  // x must stay unchanged until backward(r, ...).
  void forward(const StepContext& ctx, const Batch& b, const float* x, float* y, Record& r,
               Workspace& ws) const;
  // Given dres[rows, C] = dL/dy, overwrites it with dL/dx and ACCUMULATES the parameter
  // gradients. defer_weights (zero-bubble BI): the matmuls' weight and bias gradients wait in the
  // record for backward_weight(r) (W); the LayerNorms' (and a mixture of experts') are computed
  // now.
  void backward(Record& r, float* dres, Workspace& ws, bool defer_weights = false) const;
  // Generation with a key/value cache (GPT::decode, nn/gpt.h; a whole block on one rank): ASSIGNS
  // y[n, C] = block(x) for the step's n new tokens (x[n, C]), the attention over the keys and
  // values of `kv` (AttentionBranch::decode, which adds the new tokens' own), the MLP's ordinary
  // inference forward on the new rows in the scratch record of its kind (made by the first decode
  // that needs it). No dropout; x and y must not alias.
  void decode(const DecodeStep& step, const float* x, float* y, KvLayer& kv, DecodeScratch& s,
              Workspace& ws) const {
    TESSERA_ASSERT(attention_ && mlp_, "h.", layer_, ": decode needs a whole block");
    attention_->decode(step, x, s.x_attn.f32(), kv, s, ws);
    std::unique_ptr<MlpRecord>& r = s.mlp[mlp_->kind()];
    if (!r) r = mlp_->make_record(1, *s.alloc, nullptr);  // block_size rows: any step's
    BlockPass pass;  // one sequence of n tokens, inference (no dropout, no MoE statistics)
    pass.B = 1;
    pass.T = step.n;
    mlp_->forward(pass, s.x_attn.f32(), y, *r, ws);
  }
  // W: ACCUMULATES the weight and bias gradients a deferred backward left in r.
  void backward_weight(Record& r) const;
  // The bytes a deferred backward keeps for W of a micro-batch of `tokens` tokens (measured:
  // the modules allocate it against an allocator of address space only).
  size_t deferred_bytes(int64_t tokens) const;

  int layer() const { return layer_; }
  BlockPart part() const { return part_; }
  bool has_attention() const { return attention_ != nullptr; }
  bool has_mlp() const { return mlp_ != nullptr; }
  int heads_local() const;
  Recompute recompute() const { return recompute_; }
  bool sequence_parallel() const { return split_.sequence_parallel(); }
  // The mixture of experts of an MoE block (its statistics), or null.
  const MixtureOfExperts* moe() const { return mlp_ ? mlp_->experts() : nullptr; }

 private:
  Block(ParameterSet& ps, const GPTConfig& cfg, int layer, TensorSplit split,
        ExpertSplit expert_split, const ContextSplit* context,
        std::unique_ptr<comm::Communicator> own_context, Recompute recompute, ParameterSet* experts,
        BlockPart part, bool bf16_gemm_inputs);

  std::unique_ptr<comm::Communicator> own_context_;  // a block built without a context group
  GPTConfig cfg_;
  int layer_;
  BlockPart part_;
  TensorSplit split_;
  Recompute recompute_;
  int64_t rows_per_sequence_ = 0;  // of a record (ContextSplit::rows_per_sequence)
  std::unique_ptr<AttentionBranch> attention_;
  std::unique_ptr<Mlp> mlp_;
};

}  // namespace tessera::nn
