// What the branches of a transformer block (nn/attention.h, nn/mlp.h) share: the facts of the
// micro-batch a forward ran with, and the scratch every block of a pipeline stage uses in turn.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/core/tensor.h"
#include "tessera/kernels/row_map.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/moe.h"

namespace tessera::nn {

// What a micro-batch's forward through a block ran with; a recomputation and the backward use
// exactly this.
struct BlockPass {
  int B = 0, T = 0;
  int64_t first_sample = 0;
  // Context parallelism (Batch): the T rows of each sequence are this rank's share, at `positions`,
  // of sequences of seq_len tokens split over the model's cp group (positions null: whole
  // sequences). positions must stay valid until the micro-batch's backward.
  int64_t seq_len = 0;
  const int64_t* positions = nullptr;
  float p = 0.0f;  // the dropout probability in effect (0 outside training)
  uint64_t seed = 0, step = 0;
  float loss_scale = 0.0f;  // weighs the MoE auxiliary losses
  bool training = false;    // MoE statistics are counted in training forwards
  int64_t tokens() const { return static_cast<int64_t>(B) * T; }
  bool split() const { return positions != nullptr; }
  // Where its rows lie in the step's global batch (dropout coordinates, positions).
  kernels::RowMap row_map() const { return {first_sample, T, seq_len, positions}; }
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
  Tensor delta;     // [B, heads_local, T]: the fused attention backward's row term
  // Recomputed activations: the attention's (Selective: the core's output atty and its
  // log-sum-exp; Full: all of them), the residual stream between a block's branches (Full), and
  // each kind of MLP's (Full).
  std::unique_ptr<AttentionRecord> attention;
  Tensor x_attn;
  std::map<std::string, std::unique_ptr<MlpRecord>> mlp;
  std::shared_ptr<MixtureOfExperts::Workspace> moe;  // exchange buffers of the MoE blocks
};

// Generation with a key/value cache (KvCache and GPT::decode, nn/gpt.h): what a decode step
// through a block reads and writes besides the stage's workspace.

// The new tokens of a decode step: n of them, at positions [pos0, pos0 + n) of their sequence.
struct DecodeStep {
  int n = 0;
  int64_t pos0 = 0;
  int64_t end() const { return pos0 + n; }
};

// One layer's keys and values: [capacity, width] each, row p the key (value) heads of position p
// (rotated keys in a rotary model), heads side by side.
struct KvLayer {
  Tensor k, v;
};

// Scratch of a decode step, sized for `rows` new tokens at once and a cache of `positions`.
struct DecodeScratch {
  int64_t rows = 0, positions = 0;
  Tensor norm;                    // [rows, C]: a norm's output
  Tensor mean, rstd;              // [rows]: its statistics
  Tensor qkv;                     // [rows, (q + 2 kv) head_dim]: the new queries, keys and values
  Tensor atty;                    // [rows, q head_dim]: the attention's output, heads concatenated
  Tensor scores;                  // kernels::attention_decode's scratch
  Tensor x_attn;                  // [rows, C]: a block's residual stream between its branches
  std::vector<int64_t> position;  // [rows]: the new rows' positions (rotary)
  // One record per kind of MLP ("gelu", "moe", ...), shared by the blocks of that kind, made by
  // the first decode that runs one (in `alloc`).
  std::map<std::string, std::unique_ptr<MlpRecord>> mlp;
  Allocator* alloc = nullptr;
};

// A record's zero-bubble copies (its `deferred`, with the `tokens` it was made for) for a
// micro-batch of `tokens` tokens: made by make(tokens) when absent or made for another size.
template <class Record, class Make>
auto& deferred_for(Record& r, int64_t tokens, const Make& make) {
  if (!r.deferred || r.deferred->tokens != tokens) r.deferred = make(tokens);
  return *r.deferred;
}

// The bytes make(&alloc) allocates, counted against an allocator of address space only (what a
// zero-bubble BI keeps, measured rather than mirrored).
template <class Make>
size_t allocated_bytes(const Make& make) {
  Allocator counting("deferred", 0, Backing::AddressSpaceOnly);
  const auto kept = make(&counting);  // alive until counted
  return counting.in_use();
}

// Mlp::reserve's common part: under full recomputation, one record R of `kind` in `ws` for every
// block of the stage, filled by allocate(R&) the first time.
template <class R, class Allocate>
void reserve_mlp_record(BlockWorkspace& ws, const std::string& kind, Recompute recompute,
                        const Allocate& allocate) {
  if (recompute != Recompute::Full || ws.mlp.count(kind)) return;
  auto r = std::make_unique<R>();
  allocate(*r);
  ws.mlp[kind] = std::move(r);
}

// The recomputation record an MLP of `kind` reserved in `ws` (Mlp::reserve), as its own type R.
template <class R>
R& reserved_mlp_record(BlockWorkspace& ws, const std::string& kind, int layer) {
  auto it = ws.mlp.find(kind);
  TESSERA_ASSERT(it != ws.mlp.end(), "h.", layer, ".mlp: no recomputation record reserved");
  return static_cast<R&>(*it->second);
}

}  // namespace tessera::nn
