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

// The heads of an attention: `q` query heads and `kv` key/value heads (grouped-query attention
// when kv < q: query head h attends with key/value head h / (q / kv), as Hugging Face's
// repeat_kv; multi-query when kv = 1), each of `size` elements. qkv rows hold the queries, then the
// keys, then the values: [q * size | kv * size | kv * size].
struct AttentionHeads {
  int q = 0, kv = 0, size = 0;
  int row_width() const { return (q + 2 * kv) * size; }
  // GPT-2's: NH heads of C / NH (ShapeError when NH does not divide C).
  static AttentionHeads multi_head(int C, int NH);
};

// Grouped-query attention on qkv[B, T, heads.row_width()]: ASSIGNS out[B, T, q * size] and the
// probabilities as below (att[B, q, T, T]). ShapeError unless kv divides q.
void attention_forward(float* out, float* att, float* att_drop, const float* qkv, int B, int T,
                       const AttentionHeads& heads, const AttentionDropout* drop = nullptr);
// Its backward: ASSIGNS dqkv[B, T, heads.row_width()] (a key/value head's gradient sums those of
// its query heads).
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* att,
                        const float* att_drop, const float* qkv, int B, int T,
                        const AttentionHeads& heads, float p = 0.0f);

// Multi-head attention (GPT-2): qkv[B,T,3C]: columns [0,C) queries, [C,2C) keys, [2C,3C) values;
// head h owns columns [h*hs, (h+1)*hs) of each, hs = C / NH. ASSIGNS out[B,T,C] (heads
// concatenated) and att[B,NH,T,T] = softmax probabilities (only the causal lower triangle is
// meaningful; other entries are unspecified). With dropout (drop != null and drop->p > 0),
// att_drop[B,NH,T,T] ASSIGNED = dropped, rescaled probabilities, which multiply the values;
// att_drop may be null otherwise.
void attention_forward(float* out, float* att, float* att_drop, const float* qkv, int B, int T,
                       int C, int NH, const AttentionDropout* drop = nullptr);

// Given dout[B,T,C]: ASSIGNS dqkv[B,T,3C]. scratch[T*T] is workspace. att/att_drop as saved by
// the forward (att_drop null when there was no dropout); p is the dropout probability (0: none).
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* att,
                        const float* att_drop, const float* qkv, int B, int T, int C, int NH,
                        float p = 0.0f);

}  // namespace tessera::kernels
