// What the branches of a transformer block (nn/attention.h, nn/mlp.h) share: the facts of the
// micro-batch a forward ran with, and the scratch every block of a pipeline stage uses in turn.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "tessera/core/error.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/moe.h"

namespace tessera::nn {

// What a micro-batch's forward through a block ran with; a recomputation and the backward use
// exactly this.
struct BlockPass {
  int B = 0, T = 0;
  int64_t first_sample = 0;
  float p = 0.0f;  // the dropout probability in effect (0 outside training)
  uint64_t seed = 0, step = 0;
  float loss_scale = 0.0f;  // weighs the MoE auxiliary losses
  bool training = false;    // MoE statistics are counted in training forwards
  int64_t tokens() const { return static_cast<int64_t>(B) * T; }
};
BlockPass block_pass(const StepContext& ctx, const Batch& b, float dropout);

struct AttentionRecord;
struct MlpRecord;

// Scratch shared by every block of a stage, sized for max_batch x block_size tokens. proj, dln and
// gathered have token_range's padded() rows (the rows collectives move); the rest every token of
// this rank's columns. The recomputation scratch is added by the modules that need it
// (Attention::reserve, Mlp::reserve), so recomputation costs one block's activations per stage.
struct BlockWorkspace {
  BlockWorkspace();
  ~BlockWorkspace();
  BlockWorkspace(BlockWorkspace&&) noexcept;
  BlockWorkspace& operator=(BlockWorkspace&&) noexcept;

  Tensor proj;      // C: a projection's output before its reduce point; dropout-backward scratch
  Tensor dln;       // C: gradient w.r.t. a LayerNorm output; forward staging of a bf16-kept one
  Tensor gathered;  // C: a LayerNorm output all-gathered (sequence parallelism only)
  Tensor datty;     // C_local
  Tensor dqkv;      // 3 C_local
  Tensor dfch;      // F_local
  Tensor dscratch;  // [T, T] attention-backward scratch
  Tensor atty;      // Selective: the recomputed attention output (discarded)
  // Recomputed activations: the attention's (Selective: the probabilities; Full: all of them),
  // the residual stream between a block's branches (Full), and each kind of MLP's (Full).
  std::unique_ptr<AttentionRecord> attention;
  Tensor x_attn;
  std::map<std::string, std::unique_ptr<MlpRecord>> mlp;
  std::shared_ptr<MixtureOfExperts::Workspace> moe;  // exchange buffers of the MoE blocks
};

// The recomputation record an MLP of `kind` reserved in `ws` (Mlp::reserve), as its own type R.
template <class R>
R& reserved_mlp_record(BlockWorkspace& ws, const std::string& kind, int layer) {
  auto it = ws.mlp.find(kind);
  TESSERA_ASSERT(it != ws.mlp.end(), "h.", layer, ".mlp: no recomputation record reserved");
  return static_cast<R&>(*it->second);
}

}  // namespace tessera::nn
