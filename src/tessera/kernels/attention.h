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
  int64_t seq_len = 0;    // flash_attention's mask length L (0: its Tq); the kernels here use T
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

// Attention of n new queries of one sequence, at positions [pos0, pos0 + n), over the keys and
// values of positions [0, pos0 + n) (a key/value cache that holds the earlier positions and the new
// ones' own): query i sees keys [0, pos0 + i], so the new queries are causal among themselves.
// Query row i holds query head h at q + i * ldq + h * heads.size; key (value) row p holds key/value
// head g at k (v) + p * ldkv + g * heads.size (grouped-query heads as attention_forward). ASSIGNS
// out[n, heads.q * heads.size] (heads concatenated). No dropout (inference). scratch: at least
// attention_decode_scratch(n, pos0 + n, heads) floats. Row i's result is what attention_forward
// gives row pos0 + i of the whole sequence (to rounding: the GEMMs see other shapes).
void attention_decode(float* out, const float* q, int64_t ldq, const float* k, const float* v,
                      int64_t ldkv, int n, int64_t pos0, const AttentionHeads& heads,
                      float* scratch);
// The scratch (floats) of any attention_decode of up to max_n new queries with pos0 + n <=
// positions.
int64_t attention_decode_scratch(int max_n, int64_t positions, const AttentionHeads& heads);

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
