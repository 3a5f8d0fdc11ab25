// The Llama family's attention branch (an AttentionBranch, nn/attention_branch.h):
//   x_attn = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = RMSNorm(x),
// with Hugging Face LlamaForCausalLM names "model.layers.<l>.input_layernorm.weight" and
// "model.layers.<l>.self_attn.{q,k,v,o}_proj.weight" in nn.Linear layout [out, in] (q/k/v biases
// for Qwen2, an o_proj bias for Llama's attention_bias). Grouped-query heads (cfg.kv_heads():
// query head h reads key/value head h / (n_head / kv_heads)); rotary embeddings in the
// half-rotation convention with the model's theta and Llama 3 scaling (kernels/rope.h), at
// position t of each sequence. Dropout only on the probabilities ("...self_attn.attention_dropout"
// in Hugging Face: attention_dropout), none on the branch output.
//
// Tensor parallelism (Megatron-Core's rule): this rank holds n_head / t query heads and
// kv_heads / t key/value heads, so t must divide the key/value heads (ConfigError otherwise). The
// other rule, replicating a key/value head over the t / kv_heads ranks that share it, would
// compute each such head t / kv_heads times and need its weight gradient summed over a subgroup;
// with kv_heads >= 8 in today's large models tp <= 8 divides it anyway. q/k/v are column-parallel
// (rows of their [out, in] weights), o_proj row-parallel (columns of [C, C]); under sequence
// parallelism the norm runs on this rank's rows and its input is gathered once for q, k and v.
//
// Records, recomputation, bf16 GEMM inputs and the zero-bubble split as GPT-2's Attention: the
// record keeps the norm output (rows), qkv after rotation, atty and the fused attention's
// log-sum-exp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/nn/attention_branch.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/linear.h"

namespace tessera::nn {

// cos and sin of every position up to block_size for one head size, theta and scaling: one table
// shared by every layer (and model) that asks for the same.
struct RotaryTable {
  int head_dim = 0;
  int64_t positions = 0;
  std::vector<float> cos, sin;  // [positions, head_dim / 2]
};
std::shared_ptr<const RotaryTable> rotary_table(const GPTConfig& cfg);

class RotaryAttention final : public AttentionBranch {
 public:
  RotaryAttention(ParameterSet& ps, const GPTConfig& cfg, int layer, const TensorSplit& split,
                  const ContextSplit& context, Recompute recompute, bool bf16_gemm_inputs);

  void backward_weight(const BlockPass& mb, AttentionRecord& r) const override;
  std::shared_ptr<AttentionRecord::Deferred> make_deferred(int64_t tokens,
                                                           Allocator* alloc) const override;
  // Generation with a key/value cache (see AttentionBranch::decode): the norm and q/k/v on the new
  // rows, q and k rotated at the new positions, the keys (rotated) and values into the cache, the
  // attention over the cache, o_proj and the residual.
  void decode(const DecodeStep& step, const float* x, float* y, KvLayer& kv, DecodeScratch& s,
              BlockWorkspace& ws) const override;

 private:
  struct Heads {
    int q = 0, kv = 0, size = 0;
    int64_t width() const { return int64_t{q + 2 * kv} * size; }  // of a qkv row
  };
  void allocate_rest(AttentionRecord& r, int max_batch, Allocator& alloc,
                     std::vector<NamedActivation>* list, DType gemm_inputs) const override;
  void run_forward(const BlockPass& mb, const float* x, float* y, AttentionRecord& r,
                   BlockWorkspace& ws) const override;
  void run_backward(const BlockPass& mb, const float* x, const AttentionRecord& r, float* dres,
                    BlockWorkspace& ws, AttentionRecord::Deferred* defer) const override;
  // Rotates the queries and keys of qkv (inverse: the backward's rotation of their gradients).
  void rotate(float* qkv, const BlockPass& mb, bool inverse) const;

  const ParameterSet& ps_;
  GPTConfig cfg_;
  int layer_;
  TensorSplit split_;
  Heads heads_;  // this rank's
  int64_t c_local_;
  int norm_ = -1;
  Linear q_, k_, v_, o_;
  std::shared_ptr<const RotaryTable> rope_;
};

}  // namespace tessera::nn
