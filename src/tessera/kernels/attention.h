// Causal multi-head self-attention on a packed qkv activation (the c_attn output). Per (sample,
// head) the scores and the weighted sum are GEMMs on strided views of qkv (no copies); rows are
// processed in blocks of kAttentionBlock queries so that only the causal (lower-triangular) part
// plus the diagonal blocks is computed. Scale 1 / sqrt(head dim), as GPT-2.
#pragma once

#include <cstdint>

namespace tessera::kernels {

inline constexpr int kAttentionBlock = 64;

// Optional dropout on the attention probabilities (Hugging Face's attn_dropout). Mask element
// (sample s, global head g, query t, key j) uses index ((s * n_head_global + g) * T + t) * T + j
// with s = first_sample + b and g = head_offset + h, so a head shard (tensor parallelism) or a
// sample range draws the single-device mask.
struct AttentionDropout {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;
  int64_t first_sample = 0;
  int head_offset = 0;
  int n_head_global = 0;  // 0: the NH of the call
};

// qkv[B,T,3C]: columns [0,C) queries, [C,2C) keys, [2C,3C) values; head h owns columns
// [h*hs, (h+1)*hs) of each, hs = C / NH.
// ASSIGNS out[B,T,C] (heads concatenated) and att[B,NH,T,T] = softmax probabilities (only the
// causal lower triangle is meaningful; other entries are unspecified).
// With dropout (drop != null and drop->p > 0), att_drop[B,NH,T,T] ASSIGNED = dropped, rescaled
// probabilities, which multiply the values; att_drop may be null otherwise.
void attention_forward(float* out, float* att, float* att_drop, const float* qkv, int B, int T,
                       int C, int NH, const AttentionDropout* drop = nullptr);

// Given dout[B,T,C]: ASSIGNS dqkv[B,T,3C]. scratch[T*T] is workspace. att/att_drop as saved by
// the forward (att_drop null when there was no dropout); p is the dropout probability (0: none).
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* att,
                        const float* att_drop, const float* qkv, int B, int T, int C, int NH,
                        float p = 0.0f);

}  // namespace tessera::kernels
