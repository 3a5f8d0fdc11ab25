// The one model of a GPT's size and work: parameter counts per module and the matmul FLOPs of a
// token through each part of the model. The model reports its size and MFU with them (nn/gpt.h),
// the pipeline split balances stages with them (parallel/pipeline/pipeline_split.h), and the
// planner counts work and parameters with them (plan/), so the three cannot drift apart.
//
// Counts are global (before any sharding). FLOPs are per token, forward only, for a multiply-add
// counted as 2 and dense attention over a context of T (PaLM's convention, Chowdhery et al. 2022,
// appendix B); a backward costs twice its forward, so forward + backward is 3x (model FLOPs: the
// fused attention's backward runs BlockFlops::attention_core_recompute more).
#pragma once

#include <cstdint>

#include "tessera/nn/gpt_config.h"

namespace tessera::nn {

// Parameters of the modules of `c`.
struct GPTParams {
  int64_t wte = 0, wpe = 0;   // [V, C], [block_size, C]
  int64_t attention = 0;      // ln_1, c_attn (+ bias), attn c_proj (+ bias)
  int64_t mlp = 0;            // ln_2, c_fc (+ bias), mlp c_proj (+ bias): a dense MLP half
  int64_t expert = 0;         // one expert: c_fc (+ bias), c_proj (+ bias)
  int64_t router = 0;         // [C, E]
  int64_t shared_expert = 0;  // an MoE block's shared expert (gate, up, down) and its gate
  int64_t head = 0;           // ln_f (+ an untied lm_head [V, C])
  int64_t layer_norm = 0;     // one LayerNorm (weight and bias), or RMSNorm (weight)
  // The Llama family: attention = norm, q/k/v (grouped-query), o (+ biases); mlp = norm + gate,
  // up and down of the dense width; expert = an expert's three matrices (moe_hidden(); a dense
  // model: the MLP's); no wpe.
};
GPTParams gpt_params(const GPTConfig& c);

// The parameters of block `layer`: its attention half and its MLP half (an MoE block: ln_2, the
// router, `experts` of its experts and the shared expert).
int64_t attention_half_params(const GPTConfig& c);
int64_t mlp_half_params(const GPTConfig& c, int layer, int experts);
// The whole model's parameters (every expert), and those a token's forward multiplies with (top_k
// experts and the shared expert of an MoE block), without wpe: PaLM's N.
int64_t total_params(const GPTConfig& c);
int64_t active_params_without_wpe(const GPTConfig& c);
// Model FLOPs per token, forward + backward, no recomputation: 6 N + 6 L C T, N without an untied
// model's input embedding (a lookup). The numerator of MFU. PaLM's 12 L C T counts dense
// attention; a causal model's query meets only the keys up to it, half of that (as FlashAttention-2
// counts causal FLOPs, Dao 2023), which the fused kernel's causal tile skipping really saves: with
// the dense count MFU exceeded 100% at long sequences (126% at T = 8192 on one thread).
double model_flops_per_token(const GPTConfig& c, int T);

// Forward matmul FLOPs per token of one block's parts at context T (tensor parallelism divides
// each by the group size; an MoE block's MLP runs `mlp_passes` expert MLPs per token).
struct BlockFlops {
  double qkv = 0;             // c_attn: 2 x 3 C^2
  double attention_out = 0;   // attn c_proj: 2 x C^2
  double attention_core = 0;  // Q K^T and P V over T keys: 4 T C (dense)
  // What the fused attention's backward (kernels/flash_attention.h) runs again besides the 2x of
  // its forward: Q K^T, 2 T C (it recomputes the probabilities from the saved log-sum-exp).
  // Hardware FLOPs (the planner's time and HFU); model FLOPs and MFU leave it out, as PyTorch and
  // Megatron count FLOPs without recomputation.
  double attention_core_recompute = 0;
  double mlp = 0;            // c_fc and c_proj, per pass: 2 x 8 C^2 (SwiGLU: 2 x 3 C F)
  double router = 0;         // 2 C E (MoE blocks)
  double shared_expert = 0;  // an MoE block's shared expert, 2 x 3 C Fs, and its gate, 2 C
  // The MLP half's forward FLOPs with `passes` expert passes (mlp_passes).
  double mlp_half(int passes) const { return passes * mlp + router + shared_expert; }
  double attention() const { return qkv + attention_out + attention_core; }
};
BlockFlops block_flops(const GPTConfig& c, int layer, int T);
// The tied LM head's projection: 2 C V.
double head_flops(const GPTConfig& c);
// The expert MLP passes a token makes in block `layer`: top_k (MoE) or 1.
int mlp_passes(const GPTConfig& c, int layer);

}  // namespace tessera::nn
