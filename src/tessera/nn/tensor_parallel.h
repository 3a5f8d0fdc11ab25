// The tensor-parallel group a module's share is computed in, and the conjugate pairs of
// communication functions that tensor-parallel layers are built from. They are called visibly at
// the points where a layer enters and leaves its tensor-parallel region (docs/ARCHITECTURE.md,
// decisions 14 and 21).
//
// Tensor parallelism (Megatron-LM's f and g, Shoeybi et al. 2019, section 3):
//   copy_to_tp      before a column-parallel layer: identity forward; its backward,
//                   copy_to_tp_backward, sums the input gradient over the group.
//   reduce_from_tp  after a row-parallel layer: sums the partial outputs over the group forward;
//                   its backward is the identity (every rank already holds the full gradient).
//
// Sequence parallelism (Korthikanti et al. 2022, section 4.2.2: g and g-bar),
// TensorSplit::sequence: outside the tensor-parallel regions (LayerNorms, dropout, residual) each
// rank holds only its rows of the residual stream (token_range), and the pair above becomes
//   gather_to_tp            before a column-parallel layer: all-gather of the rows forward; its
//                           backward, gather_to_tp_backward, reduce-scatters the input gradient.
//   reduce_scatter_from_tp  after a row-parallel layer: reduce-scatter of the partial outputs
//                           forward (each rank keeps the sum for its rows); its backward,
//                           reduce_scatter_from_tp_backward, all-gathers the output gradient.
//
// With one rank all of them are identities. Their collectives move activations or
// activation gradients in TensorSplit::wire (fp32, or bf16 under --activation-comm-dtype bf16:
// rounded before, widened after, comm/wire.h); the loss statistics (max_over_tp, sum_over_tp)
// always travel in fp32.
#pragma once

#include <cstdint>

#include "tessera/comm/communicator.h"
#include "tessera/nn/parameters.h"

namespace tessera::nn {

// The tensor-parallel group a module's share is computed in. Always a group: one rank (a size-1
// communicator, comm::one_rank()) means no tensor parallelism, and every collective below is then
// the identity, so a module reads the same for every layout.
struct TensorSplit {
  explicit TensorSplit(comm::Communicator& g, bool seq = false, DType w = DType::F32)
      : group(g), sequence(seq), wire(w) {}
  comm::Communicator& group;
  bool sequence = false;    // sequence parallelism (only with more than one rank)
  DType wire = DType::F32;  // what activations and their gradients travel in: F32 or BF16
  int size() const { return group.size(); }
  int rank() const { return group.rank(); }
  bool sequence_parallel() const { return sequence && size() > 1; }
};

// The vocabulary rows [begin, end) a tensor-parallel rank holds of wte (the vocabulary-parallel
// embedding and head): rank r holds [r * ceil(V/t), min(V, (r + 1) * ceil(V/t))). When t does not
// divide V the last shards are shorter (possibly empty); there are no padding rows, so no logit
// exists for a token outside the vocabulary and padding can never be predicted.
struct VocabRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
VocabRange vocab_range(const TensorSplit& s, int64_t vocab_size);
// The ShardSpec of wte [V, C] for this rank's rows (whole tensor without tensor parallelism).
ShardSpec vocab_shard(const TensorSplit& s, int64_t vocab_size);

// The rows of an [n, width] activation (n = B*T tokens in b*T + t order) this rank holds outside
// the tensor-parallel regions. Under sequence parallelism: a contiguous slice, rank r holds
// [r * per, min(n, (r + 1) * per)) with per = ceil(n/t) (the last slices shorter, possibly empty,
// when t does not divide n); otherwise all n rows, per = n. Collectives move `per` rows per rank:
// a gathered buffer has padded() = t * per rows, of which the first n are the activation (every
// shorter slice is at the end) and the rest is padding that is never read.
struct TokenRange {
  int64_t begin = 0, end = 0;  // this rank's rows
  int64_t per = 0;             // rows of every rank's slice buffer
  int ranks = 1, rank = 0;
  int64_t size() const { return end - begin; }
  int64_t padded() const { return per * ranks; }
  // Where this rank's slice lies in a padded buffer (= begin unless the slice is empty).
  int64_t place() const { return per * rank; }
};
TokenRange token_range(const TensorSplit& s, int64_t n);

// Identity (the forward half of copy_to_tp): returns x, the input of the column-parallel layer.
inline const float* copy_to_tp(const TensorSplit&, const float* x, int64_t) {
  return x;
}
// dx[n] = sum over the group of dx[n] (the backward half of copy_to_tp). Returns dx.
float* copy_to_tp_backward(const TensorSplit& s, float* dx, int64_t n);
// x[n] = sum over the group of x[n] (the forward half of reduce_from_tp). Returns x.
float* reduce_from_tp(const TensorSplit& s, float* x, int64_t n);

// ASSIGNS full[rows.padded(), width] = every rank's rows (slice[rows.per, width] of each) in rank
// order; returns full, whose first n rows are the whole activation. slice may be this rank's
// place in full (full + rank * per * width: in place).
const float* gather_to_tp(const TensorSplit& s, const float* slice, float* full,
                          const TokenRange& rows, int64_t width);
// ASSIGNS slice[rows.per, width] = the sum over the group of this rank's rows of dfull; returns
// slice (which may be dfull's place of this rank: in place).
float* gather_to_tp_backward(const TensorSplit& s, const float* dfull, float* slice,
                             const TokenRange& rows, int64_t width);
// The same reduce-scatter: ASSIGNS slice = this rank's rows of the sum of the partial outputs full
// over the group; returns slice.
float* reduce_scatter_from_tp(const TensorSplit& s, const float* full, float* slice,
                              const TokenRange& rows, int64_t width);
// The same all-gather: ASSIGNS dfull = every rank's rows of the output gradient; returns dfull.
float* reduce_scatter_from_tp_backward(const TensorSplit& s, const float* dslice, float* dfull,
                                       const TokenRange& rows, int64_t width);

// x[n] = max over the group of x[n] (the vocabulary-parallel cross-entropy's row maxima).
void max_over_tp(const TensorSplit& s, float* x, int64_t n);
// x[n] = sum over the group of x[n], always in fp32 (the cross-entropy's row statistics, and
// disjoint slices assembled exactly, e.g. a sampled row's logits).
void sum_over_tp(const TensorSplit& s, float* x, int64_t n);

// Marks parameter i (replicated across the group) as one whose gradient each rank computes from
// its rows only under sequence parallelism (the LayerNorms): the data-parallel engine then sums
// it over the tensor-parallel ranks (GradReduction::over_tensor_parallel, decision 16).
void mark_sequence_partial(ParameterSet& ps, int i, const TensorSplit& s);

}  // namespace tessera::nn
