// The pieces a block's branches (nn/attention.h, nn/mlp.h) are built from: a column-parallel
// linear layer, where a branch enters its tensor-parallel region, and a row-parallel one, where it
// leaves it and adds "reduce, then bias, dropout and residual" once (Megatron-LM's
// ColumnParallelLinear / RowParallelLinear with f and g, Shoeybi et al. 2019). Under sequence
// parallelism (Korthikanti et al. 2022) the same helpers gather the input rows before the column
// layer and reduce-scatter the output after the row layer, so a branch reads the same for every
// layout; with one tensor-parallel rank every collective is the identity.
//
// Outside the region a rank holds its rows of the B*T tokens (token_range: all of them without
// sequence parallelism); inside, every token and its share of the columns.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "tessera/core/tensor.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/row_map.h"
#include "tessera/nn/block_workspace.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/tensor_parallel.h"

namespace tessera::nn {

// A linear layer y = x W (+ b) in a ParameterSet: W [in, out] in Hugging Face Conv1D layout
// (GPT-2), or, `transposed`, W [out, in] in nn.Linear layout (y = x W^T: Llama); this rank's output
// columns (column-parallel) or input rows (row-parallel) of it; `in`, `out` the local widths.
struct Linear {
  int weight = -1;
  int bias = -1;  // -1: none (or, for a row-parallel layer, added by row_linear after the reduce)
  int64_t in = 0, out = 0;
  bool transposed = false;
};

// Several nn.Linear-layout layers that read one input (q, k and v; gate and up) as one layer of
// their summed output width, when their weights (values, gradients and any bf16 copies) and
// biases lie back to back where they are right now: then W_1, W_2, ... are the rows of one
// [sum out, in] matrix and one GEMM computes what the layers' GEMMs would, into the same columns.
// nullopt otherwise (padding between them, a missing bias on one of them).
std::optional<Linear> fused(const ParameterSet& ps, std::initializer_list<const Linear*> layers);

// ASSIGNS y[tokens, l.out] (row stride ldy >= l.out) = x[tokens, l.in] W (+ b).
void linear_forward(const ParameterSet& ps, const Linear& l, float* y, int64_t ldy,
                    kernels::GemmInput x, int64_t tokens);
// Backward of linear_forward given dy (row stride lddy): dx[tokens, l.in] = dy W^T (ASSIGNS, or
// ACCUMULATES with accumulate_dx; null skips it); dweight += and dbias += (null skips them).
void linear_backward(const ParameterSet& ps, const Linear& l, float* dx, bool accumulate_dx,
                     float* dweight, float* dbias, const float* dy, int64_t lddy,
                     kernels::GemmInput x, int64_t tokens);

// One micro-batch's tensor-parallel region: the group, this rank's rows of the `tokens` tokens
// outside the region, the residual stream's width, and the stage's scratch of rows.padded() x
// width floats each.
struct TpRegion {
  TpRegion(const TensorSplit& split, int64_t tokens, int64_t width, float* gathered, float* proj);
  const TensorSplit& split;
  TokenRange rows;
  int64_t tokens;
  int64_t width;
  float* gathered;  // an all-gathered input (sequence parallelism; may be null otherwise)
  float* proj;      // a row-parallel output before its reduce point; the output gradient after
  bool sequence() const { return split.sequence_parallel(); }
  // Elements of this rank's rows of the residual stream.
  int64_t row_elems() const { return rows.size() * width; }
};

// The dropout of a branch's output before the residual add, on this rank's rows [first, ...) of
// the micro-batch; its mask is keyed by the global token of each row (map.global_row(first + i):
// kernels/row_map.h), so the rows draw the single-device mask, under sequence and context
// parallelism alike.
struct BranchDropout {
  float p = 0.0f;
  uint64_t seed = 0, stream = 0;
  kernels::RowMap map;
  int64_t first = 0;
  uint8_t* mask = nullptr;  // U8 [rows, width]; needed when p > 0
  // ASSIGNS mask[rows, width] = the keep mask of these rows without applying it (a recomputation
  // that needs only the mask).
  void draw_mask(int64_t rows, int width) const;
};

// A block branch's region for micro-batch `mb`: its tokens, the residual stream's width, and the
// stage's scratch in `ws`.
TpRegion branch_region(const TensorSplit& split, const BlockPass& mb, BlockWorkspace& ws,
                       int64_t width);
// The dropout of a branch's output for micro-batch `mb` at the dropout site `site` (a stable hash
// of its name), over the region's rows; `mask` is the record's (undefined when p = 0).
BranchDropout branch_dropout(const BlockPass& mb, const TpRegion& region, uint64_t site,
                             const Tensor& mask);

// Where a branch enters its tensor-parallel region: the input of every token that the
// column-parallel layers read, from this rank's rows (x_rows fp32, `kept` as the record keeps them;
// see column_linear). Several column layers may read one entry (q, k and v; gate and up).
kernels::GemmInput enter_tp(const TpRegion& region, const float* x_rows, kernels::GemmInput kept);

// Column-parallel forward: ASSIGNS y[tokens, l.out] = to_tp(x) W + b. x is this rank's rows of the
// input twice over: its fp32 values (x_rows) and what the caller keeps of them (kept: the same
// fp32 values or their bf16 bits). Under sequence parallelism the fp32 rows are all-gathered into
// region.gathered and the GEMM reads those; otherwise it reads `kept`.
void column_linear(const TpRegion& region, const ParameterSet& ps, const Linear& l, float* y,
                   const float* x_rows, kernels::GemmInput kept);
// What the column-parallel layer's weight gradient reads: `rows` (this rank's rows of the input as
// the record keeps them, fp32 or bf16) all-gathered again under sequence parallelism (bf16 rows
// widened into their place first, exact), else `rows` itself.
kernels::GemmInput column_linear_input(const TpRegion& region, const Tensor& rows);
// Column-parallel backward of the input: dx_tokens[tokens, width] holds this rank's partial input
// gradient of every token; returns this rank's rows of the sum over the group (in place).
float* column_linear_grad_input(const TpRegion& region, float* dx_tokens);

// Row-parallel forward with the branch's residual: out[rows, width] = residual + dropout(sum over
// the group of (x W) + b) on this rank's rows (x [tokens, l.in]; the product goes to
// region.proj). out may alias residual only when both are the same rows.
void row_linear(const TpRegion& region, const ParameterSet& ps, const Linear& l, float* out,
                kernels::GemmInput x, const float* residual, const BranchDropout& drop);
// The tail of row_linear on a branch output y[rows, width] already reduced (a mixture of experts'
// complete output): out = residual + dropout(y + b); y is overwritten. bias may be null.
void residual_branch(const TpRegion& region, float* out, float* y, const float* bias,
                     const float* residual, const BranchDropout& drop);
// Row-parallel backward of the output: dres[rows, width] = dL/d out; returns dL/d (x W) of every
// token (the dropout's backward on this rank's rows into region.proj, all-gathered under sequence
// parallelism; dres itself without dropout or sequence parallelism).
const float* row_linear_grad_output(const TpRegion& region, const float* dres,
                                    const BranchDropout& drop);

}  // namespace tessera::nn
