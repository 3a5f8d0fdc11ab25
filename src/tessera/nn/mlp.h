// A block's MLP branch as a module interface: y = x + dropout(mlp(norm(x))), on this rank's rows
// of the residual stream. Its kinds: GPT-2's MLP (GeluMlp, nn/gelu_mlp.h) and mixture of experts
// (MoeMlp, nn/moe_mlp.h), the Llama family's SwiGLU MLP (SwigluMlp, nn/swiglu_mlp.h) and mixture
// of experts (SwigluMoeMlp, nn/swiglu_moe_mlp.h); a Block holds one of them behind its attention
// (nn/block.h), so a new kind of MLP is a new module, not a branch in the block.
//
// The contract every kind keeps (the one nn/attention.h keeps too): forward/backward run over a
// record the caller owns, one per micro-batch in flight (make_record); parameter gradients
// ACCUMULATE; under full recomputation the record keeps nothing and the block reruns the forward
// into the workspace's record of this kind (recompute) just before the backward; the zero-bubble
// split (defer) leaves the matmuls' weight gradients for backward_weight.
#pragma once

#include <memory>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/nn/activations.h"
#include "tessera/nn/block_workspace.h"

namespace tessera::nn {

// The activations of one micro-batch through an MLP branch (each kind has its own).
struct MlpRecord {
  virtual ~MlpRecord() = default;
};

class Mlp {
 public:
  virtual ~Mlp() = default;
  // The kind's name ("gelu", "moe", "swiglu", "swiglu_moe"): the workspace keeps one recomputation
  // record per kind.
  virtual const char* kind() const = 0;

  // The activations this module's recompute mode keeps for a micro-batch of up to max_batch
  // sequences; `list` (optional) collects the F32 ones by name.
  virtual std::unique_ptr<MlpRecord> make_record(int max_batch, Allocator& alloc,
                                                 std::vector<NamedActivation>* list) const = 0;
  // Adds to the stage's workspace what this module needs and it lacks (its recomputation record).
  virtual void reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const = 0;

  // ASSIGNS y[rows, C] = x + dropout(mlp(norm(x))); x must stay unchanged until backward.
  virtual void forward(const BlockPass& mb, const float* x, float* y, MlpRecord& r,
                       BlockWorkspace& ws) const = 0;
  // Full recomputation: the forward again into the workspace's record of this kind, without the
  // output (only the dropout mask the backward needs).
  virtual void recompute(const BlockPass& mb, const float* x, BlockWorkspace& ws) const = 0;
  // Given dres[rows, C] = dL/dy, overwrites it with dL/dx and ACCUMULATES the gradients. defer
  // (zero-bubble BI): the matmuls' weight gradients wait in the record for backward_weight.
  virtual void backward(const BlockPass& mb, const float* x, MlpRecord& r, float* dres,
                        BlockWorkspace& ws, bool defer) const = 0;
  virtual void backward_weight(const BlockPass& mb, MlpRecord& r) const = 0;
  // The bytes a deferred backward (zero-bubble BI) keeps for W of a micro-batch of `tokens`
  // tokens, measured by allocating them against an allocator of address space only.
  virtual size_t deferred_bytes(int64_t tokens) const = 0;

  // The mixture of experts inside (its statistics), or null for a dense MLP.
  virtual const MixtureOfExperts* experts() const { return nullptr; }
};

}  // namespace tessera::nn
