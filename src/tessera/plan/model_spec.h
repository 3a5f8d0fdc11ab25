// The model a plan is for, by its sizes only: GPT-2 (learned positions, pre-LayerNorm blocks, the
// LM head tied to the token embedding), optionally with mixture-of-experts MLPs, or the Llama
// family (rotary, RMSNorm, grouped-query attention, SwiGLU MLP of ffn_dim, tied or untied head).
// Parameter counts are global (before any sharding); nothing is allocated.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "tessera/nn/gpt_config.h"

namespace tessera::plan {

// Mixture of experts: the MLP of some blocks becomes `experts` GPT-2 MLPs behind a linear router
// (no bias). Block l (0-based) is an MoE block when l % every == every - 1.
struct MoeSpec {
  int experts = 0;  // 0: every MLP is dense
  int top_k = 2;    // experts each token is sent to
  int every = 1;
  // Tokens an expert takes per micro-batch: capacity_factor * top_k * tokens / experts; 0 means
  // dropless, which the planner models as perfectly balanced routing (the same average).
  double capacity_factor = 0;
  // The Llama family's fine-grained experts: a SwiGLU expert's width (0: the model's ffn_dim), a
  // shared expert's (0: none) and whether a sigmoid gate scales it (Qwen2-MoE).
  int ffn_dim = 0;
  int shared_ffn_dim = 0;
  bool shared_gate = false;
  bool enabled() const { return experts > 0; }
  bool is_moe_layer(int layer) const { return experts > 0 && layer % every == every - 1; }
  friend bool operator==(const MoeSpec&, const MoeSpec&) = default;
};

struct ModelSpec {
  int layers = 4;
  int hidden = 192;  // C (h in the papers)
  int heads = 4;
  int seq = 128;       // tokens per sequence in training (s)
  int vocab = 512;     // V
  int context = 0;     // rows of wpe, and the length activation buffers are sized for; 0 = seq
  double dropout = 0;  // > 0: dropout masks are kept for the backward
  MoeSpec moe;
  // The Llama family (nn/gpt_config.h).
  nn::Arch arch = nn::Arch::Gpt2;
  int kv_heads = 0;  // 0: heads
  int ffn_dim = 0;   // 0: Llama's rule
  bool tie_embeddings = true;
  bool qkv_bias = false;

  int block_size() const { return context > 0 ? context : seq; }
  int64_t ffn() const;  // the MLP's hidden width: 4C (GPT-2) or ffn_dim
  int64_t qkv() const;  // the q/k/v projection's width: 3C, or (heads + 2 kv_heads) x head size

  // Global parameter counts and model FLOPs, from the one model of the model (nn/gpt_costs.h).
  int64_t total_params() const;
  // Model FLOPs per token, forward + backward, no recomputation (PaLM, dense attention): 6 N + 12
  // L C T, N the parameters a token's forward multiplies with, without wpe. The numerator of MFU.
  double model_flops_per_token() const;

  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

// ConfigError naming the field: non-positive sizes, heads not dividing the width, dropout outside
// [0, 1), MoE settings out of range.
void validate(const ModelSpec& m);

// The tessera model configuration with these sizes, mixture of experts included (the pipeline
// split, the parameter layout and the counts of nn/gpt_costs.h use it).
nn::GPTConfig to_gpt_config(const ModelSpec& m);

// {"layers": .., "hidden": .., "heads": .., "seq": .., "vocab": .., "context": .., "dropout": ..,
//  "moe": {"experts": .., "top_k": .., "every": .., "capacity_factor": ..}}, and for the Llama
// family "arch": "llama", "kv_heads", "ffn_dim", "tie_embeddings", "qkv_bias".
nlohmann::json to_json(const ModelSpec& m);
// Also accepts a Hugging Face config.json: GPT-2's (n_layer, n_embd, n_head, n_positions,
// vocab_size; seq defaults to n_positions; unknown keys are errors) or the Llama family's
// (model_type llama, mistral or qwen2, read as `tessera train --model` reads it; seq defaults to
// max_position_embeddings, and a "seq" key may be added). ConfigError on wrong types.
ModelSpec model_from_json(const nlohmann::json& j, const std::string& source);

std::string describe(
    const ModelSpec& m);  // "GPT L=24 C=2304 heads=24 s=2048 V=51200, 1.65B params"

}  // namespace tessera::plan
