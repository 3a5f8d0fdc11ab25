// GPT-2's MLP branch as a module (an Mlp, nn/mlp.h): y = x + dropout(gelu(ln_2(x) W_fc + b_fc)
// W_proj + b_proj), with HF names "h.<l>.ln_2.*", "h.<l>.mlp.c_fc.*", "h.<l>.mlp.c_proj.*" and the
// dropout site "h.<l>.mlp.dropout". Hidden width 4C.
//
// Tensor parallelism: this rank holds 4C / t hidden columns: c_fc's columns, c_proj's rows
// (column_linear / row_linear, nn/linear.h). Sequence parallelism and bf16 GEMM inputs as in
// nn/attention.h: the record keeps ln_2's output (this rank's rows) and gelu(fc) in bf16 under bf16
// GEMMs, and fc in fp32 (GELU's backward reads it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/nn/context_parallel.h"
#include "tessera/nn/linear.h"
#include "tessera/nn/mlp.h"

namespace tessera::nn {

struct GeluMlpRecord final : MlpRecord {
  // (B): BF16 under bf16 GEMM inputs, else F32. Empty under full recomputation.
  Tensor ln2, ln2_mean, ln2_rstd;  // rows x C (B), rows, rows
  Tensor fc, fch;                  // every token x F_local: before GELU, after it (B)
  Tensor mask;                     // U8 rows x C: the branch output's dropout mask
  // Zero-bubble split: the matmuls' output gradients, and the inputs the record does not keep
  // whole (ln_2 under full recomputation or sequence parallelism, gelu(fc) under full).
  struct Deferred {
    Tensor d_proj, d_fc, ln2, fch;
    int64_t tokens = 0;
  };
  std::shared_ptr<Deferred> deferred;
};

class GeluMlp final : public Mlp {
 public:
  // `context`: its records hold context.rows_per_sequence(block_size) rows of each sequence.
  GeluMlp(ParameterSet& ps, const GPTConfig& cfg, int layer, const TensorSplit& split,
          const ContextSplit& context, Recompute recompute, bool bf16_gemm_inputs);

  const char* kind() const override { return "gelu"; }
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
  void allocate(GeluMlpRecord& r, int max_batch, Allocator& alloc,
                std::vector<NamedActivation>* list, DType gemm_inputs) const;
  // The forward into r; y null: without c_proj and the residual (a recomputation).
  void run_forward(const BlockPass& mb, const float* x, float* y, GeluMlpRecord& r,
                   BlockWorkspace& ws) const;
  void run_backward(const BlockPass& mb, const float* x, const GeluMlpRecord& r, float* dres,
                    BlockWorkspace& ws, GeluMlpRecord::Deferred* defer) const;
  GeluMlpRecord::Deferred& deferred_for(const BlockPass& mb, GeluMlpRecord& r) const;
  std::shared_ptr<GeluMlpRecord::Deferred> make_deferred(int64_t tokens, Allocator* alloc) const;
  GeluMlpRecord& scratch(BlockWorkspace& ws) const;

  const ParameterSet& ps_;
  GPTConfig cfg_;
  int layer_;
  TensorSplit split_;
  Recompute recompute_;
  bool bf16_gemm_inputs_;
  int64_t rows_per_sequence_;  // of a record (ContextSplit::rows_per_sequence)
  int64_t hidden_local_;
  int ln_w_ = -1, ln_b_ = -1;
  Linear c_fc_, c_proj_;
  uint64_t site_drop_;
};

}  // namespace tessera::nn
