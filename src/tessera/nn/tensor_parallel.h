// The tensor-parallel group a module's share is computed in, and the conjugate pair of
// communication functions that tensor-parallel layers are built from (Megatron-LM's f and g,
// Shoeybi et al. 2019, section 3). They are called visibly at the points where a layer needs them:
//
//   copy_to_tp      before a column-parallel layer: identity forward; its backward,
//                   copy_to_tp_backward, sums the input gradient over the group.
//   reduce_from_tp  after a row-parallel layer: sums the partial outputs over the group forward;
//                   its backward is the identity (every rank already holds the full gradient).
//
// With one rank (or no group) both are identities.
#pragma once

#include <cstdint>

#include "tessera/comm/communicator.h"
#include "tessera/nn/parameters.h"

namespace tessera::nn {

struct TensorSplit {
  comm::Communicator* group = nullptr;  // null: no tensor parallelism
  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
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

// Identity (the forward half of copy_to_tp); kept as a call so the layer reads like the math.
inline void copy_to_tp(const TensorSplit&, const float*, int64_t) {}
// dx[n] = sum over the group of dx[n] (the backward half of copy_to_tp).
void copy_to_tp_backward(const TensorSplit& s, float* dx, int64_t n);
// x[n] = sum over the group of x[n] (the forward half of reduce_from_tp).
void reduce_from_tp(const TensorSplit& s, float* x, int64_t n);

}  // namespace tessera::nn
