// A GPT-2 transformer block as a module: x -> x + attn(ln_1(x)) -> + mlp(ln_2(.)), with HF names
// "h.<l>.ln_1.weight", "h.<l>.attn.c_attn.weight", ... forward/backward run over a Record that
// the caller owns (one per micro-batch in flight); parameter gradients ACCUMULATE.
//
// Local widths (Megatron-LM's split, Shoeybi et al. 2019): on tensor-parallel rank r of t the
// block holds n_head/t heads and 4C/t MLP columns. c_attn and c_fc are column-parallel (rank r
// holds the same columns of q, k and v), both c_proj row-parallel. The output of a row-parallel
// projection is a partial sum: the bias, dropout and residual are added once, after the point
// where the tensor-parallel ranks reduce it (marked "reduce point" in block.cc). With t = 1 (the
// only case this module runs alone) the reduce points are identities.
//
// Sequence parallelism (TensorSplit::sequence, Korthikanti et al. 2022): the block's input and
// output, the LayerNorms, the residual-branch dropouts and the residual adds hold only this
// rank's rows (token_range); the column-parallel inputs are all-gathered (gather_to_tp) and the
// row-parallel outputs reduce-scattered (reduce_scatter_from_tp) instead of all-reduced. The
// record keeps the LayerNorm outputs of its rows only; the backward all-gathers them again for the
// weight gradients. The LayerNorms' parameter gradients are then partial (summed over the group
// by the data-parallel engine); the row-parallel biases get theirs from the all-gathered output
// gradient, complete on every rank.
//
// Activation recomputation (gpt_config.h): the Record keeps everything (None), everything but
// the attention probabilities (Selective), or nothing but the bookkeeping (Full); the caller
// always keeps the block's input alive until its backward. Recomputed values go to the shared
// Workspace, so recomputation costs one block's activations per stage, not one per block.
//
// Halves (BlockPart): a pipeline stage may end after a block's attention half (x -> x_attn) and
// the next begin with its MLP half (x_attn -> y), so that stages balance at a finer grain than
// whole blocks. A half registers only its own parameters and keeps only its own activations; the
// two halves' forward and backward are the whole block's, operation for operation.
//
// bf16 GEMM inputs (bf16_gemm_inputs, set by a GPT under --precision bf16; decision 33): the
// record keeps the tensors whose only readers are bf16 GEMMs in bf16 (ln_1, atty, and a dense
// MLP's ln_2 and gelu(fc): the backward reads them only for weight gradients), which the GEMMs
// would round to the same values anyway. The forward computes them in fp32 into workspace scratch,
// feeds that to its GEMM and rounds it into the record, so the numbers are bitwise those of fp32
// records, in half their bytes. qkv (read by the attention's softmax path), fc (GELU's backward)
// and everything of recomputation, MoE blocks and the zero-bubble copies stay fp32.
//
// Mixture of experts (cfg.moe.is_moe_layer(layer)): the MLP is an MoeMlp (nn/moe.h) instead of
// c_fc / c_proj; everything else is the same. Its router and experts compute all their gradients
// in backward (also under the zero-bubble split).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/activations.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/moe.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/tensor_parallel.h"

namespace tessera::nn {

class Block {
 public:
  struct Record {
    // [B, T, width] unless noted; empty where the recompute mode drops them. "rows": this rank's
    // rows of the B*T tokens under sequence parallelism (all of them otherwise).
    // (B): BF16 under bf16_gemm_inputs (see above), else F32.
    Tensor ln1, ln1_mean, ln1_rstd;  // rows x C (B), 1, 1
    Tensor qkv;                      // 3 * C_local (this rank's q, k and v columns)
    Tensor att, att_drop;            // [B, heads_local, T, T] probabilities, dropped copy
    Tensor atty;                     // C_local (attention output, heads concatenated) (B)
    Tensor x_attn;  // rows x C (residual stream after the attention branch); Whole blocks only
    Tensor ln2, ln2_mean, ln2_rstd;  // rows x C (B unless MoE), 1, 1
    Tensor fc, fch;                  // F_local = 4C / t (before and after GELU (B)); dense MLP only
    std::shared_ptr<MoeMlp::Record> moe;  // MoE blocks: the router's and experts' activations
    Tensor mask_attn, mask_mlp;           // U8 rows x C: residual-branch dropout masks
    // Zero-bubble split backward (BI now, W later): the four matmuls' output gradients (of every
    // token), and the inputs the record does not keep whole: the LayerNorm outputs under full
    // recomputation or sequence parallelism, atty and fch under full recomputation.
    struct DeferredWeightGrads {
      Tensor d_mproj, d_fc, d_aproj, d_attn;
      Tensor ln1, atty, ln2, fch;  // undefined where the record has them
      int64_t tokens = 0;          // B * T they are sized for
    };
    std::shared_ptr<DeferredWeightGrads> deferred;
    // What the forward ran with (a recomputation reruns exactly this).
    const float* x = nullptr;  // the block's (half's) input, owned and kept alive by the caller
    int B = 0, T = 0;
    int64_t first_sample = 0;
    float p = 0.0f;
    uint64_t seed = 0, step = 0;
    float loss_scale = 0.0f;  // weighs the MoE auxiliary losses
    bool training = false;    // MoE statistics are counted in training forwards
  };

  // Scratch shared by every block of a stage (sized for max_batch x block_size tokens).
  // proj, dln and gathered have token_range's padded() rows (the rows collectives move).
  struct Workspace {
    Tensor proj;      // C: a projection's output before its reduce point; dropout-backward scratch
    Tensor dln;       // C: gradient w.r.t. a LayerNorm output
    Tensor gathered;  // C: a LayerNorm output all-gathered (sequence parallelism only)
    Tensor datty;     // C_local
    Tensor dqkv;      // 3 C_local
    Tensor dfch;      // F_local
    Tensor dscratch;  // [T, T] attention-backward scratch
    Tensor atty;      // Selective: recomputed attention output (discarded)
    std::unique_ptr<Record> recomputed;      // Selective: att, att_drop; Full: every activation
    std::shared_ptr<MoeMlp::Workspace> moe;  // exchange buffers of the MoE blocks
  };

  // An MoE block registers its router in `ps` and this rank's experts in `experts` (null: in ps).
  // bf16_gemm_inputs: keep the GEMM-only inputs in bf16 (only for a model whose GEMMs are bf16).
  Block(ParameterSet& ps, const GPTConfig& cfg, int layer, TensorSplit split, Recompute recompute,
        ParameterSet* experts = nullptr, ExpertSplit expert_split = {},
        BlockPart part = BlockPart::Whole, bool bf16_gemm_inputs = false);

  // Allocates the activations this block's recompute mode keeps for one micro-batch of up to
  // max_batch sequences. `list` (optional) collects the F32 ones by name.
  Record make_record(int max_batch, Allocator& alloc,
                     std::vector<NamedActivation>* list = nullptr) const;
  Workspace make_workspace(int max_batch, Allocator& alloc) const;
  // Adds to a workspace made by another block of the stage what this block's recomputation needs
  // and it lacks (an MoE block's record after a dense one's workspace, or the reverse).
  void complete_workspace(Workspace& ws, int max_batch, Allocator& alloc) const;

  // ASSIGNS y[B, T, C] = block(x) (of a half: x_attn = attention half(x), y = MLP half(x_attn)).
  // x must stay unchanged until backward(r, ...).
  void forward(const StepContext& ctx, const Batch& b, const float* x, float* y, Record& r,
               Workspace& ws) const;
  // Given dres[B, T, C] = dL/dy, overwrites it with dL/dx and ACCUMULATES the parameter
  // gradients. defer_weights (zero-bubble BI): only the LayerNorms' parameter gradients now; the
  // four matmuls' weight and bias gradients wait in r.deferred for backward_weight(r) (W).
  void backward(Record& r, float* dres, Workspace& ws, bool defer_weights = false) const;
  // W: ACCUMULATES the weight and bias gradients a deferred backward left in r.
  void backward_weight(Record& r) const;

  int layer() const { return layer_; }
  BlockPart part() const { return part_; }
  bool has_attention() const { return part_ != BlockPart::Mlp; }
  bool has_mlp() const { return part_ != BlockPart::Attention; }
  int heads_local() const { return heads_local_; }
  Recompute recompute() const { return recompute_; }
  int64_t c_local() const { return c_local_; }
  int64_t mlp_local() const { return mlp_local_; }
  bool sequence_parallel() const { return sequence_; }
  const MoeMlp* moe() const { return moe_ ? &*moe_ : nullptr; }

 private:
  struct Params {
    int ln1_w, ln1_b, attn_w, attn_b, aproj_w, aproj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w, mproj_b;
  };
  // The forward into `r` (every tensor of r must be allocated). write_output = false skips the
  // last projection and residual add (a recomputation only needs the saved activations).
  void run_forward(const float* x, float* y, Record& r, Workspace& ws, bool write_output) const;
  // The attention core: atty, att and att_drop from r.qkv.
  void attention(float* atty, float* att, float* att_drop, const Record& r) const;
  // The backward from a record whose activations are all present.
  // `defer`: where the matmuls' output gradients go instead of their weight gradients.
  void run_backward(const Record& r, float* dres, Workspace& ws,
                    Record::DeferredWeightGrads* defer = nullptr) const;
  Record::DeferredWeightGrads& deferred_for(Record& r) const;
  // The activations of `part` (the workspace's recomputation record: always the whole block, in
  // fp32); gemm_inputs: the dtype of the GEMM-only inputs.
  void allocate(Record& r, int max_batch, Allocator& alloc, std::vector<NamedActivation>* list,
                bool keep_attention, bool keep_rest, BlockPart part,
                DType gemm_inputs = DType::F32) const;

  const ParameterSet& ps_;
  GPTConfig cfg_;
  int layer_;
  BlockPart part_;
  TensorSplit split_;
  bool sequence_;
  Recompute recompute_;
  bool bf16_gemm_inputs_;
  int heads_local_;
  int64_t c_local_, mlp_local_;
  Params q_{};
  std::optional<MoeMlp> moe_;
  uint64_t site_attn_drop_, site_resid_drop_, site_mlp_drop_;
};

}  // namespace tessera::nn
