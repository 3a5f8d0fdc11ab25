#include "tessera/kernels/attention.h"

#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/vec_math.h"

namespace tessera::kernels {

namespace {

// Row t of a block whose keys span [0, r1): softmax over [0, t], zeros on (t, r1).
// `s` holds the scaled scores on entry and the probabilities on exit.
inline void causal_softmax_row(float* s, int t, int r1) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j <= t; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j <= t; ++j) {
    const float e = detail::exp_f(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j <= t; ++j) s[j] *= inv;
  for (int j = t + 1; j < r1; ++j) s[j] = 0.0f;
}

}  // namespace

AttentionHeads AttentionHeads::multi_head(int C, int NH) {
  TESSERA_CHECK_AS(ShapeError, NH > 0 && C % NH == 0, "attention: ", NH,
                   " heads do not divide width ", C);
  return AttentionHeads{NH, NH, C / NH};
}

namespace {
void check_attention_heads(const AttentionHeads& h) {
  TESSERA_CHECK_AS(ShapeError, h.q > 0 && h.kv > 0 && h.size > 0 && h.q % h.kv == 0,
                   "attention: ", h.kv, " key/value heads must divide ", h.q, " query heads");
}
}  // namespace

void attention_forward(float* out, float* att, float* att_drop, const float* qkv, int B, int T,
                       int C, int NH, const AttentionDropout* drop) {
  attention_forward(out, att, att_drop, qkv, B, T, AttentionHeads::multi_head(C, NH), drop);
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* att,
                        const float* att_drop, const float* qkv, int B, int T, int C, int NH,
                        float p) {
  attention_backward(dqkv, scratch, dout, att, att_drop, qkv, B, T,
                     AttentionHeads::multi_head(C, NH), p);
}

void attention_forward(float* out, float* att, float* att_drop, const float* qkv, int B, int T,
                       const AttentionHeads& heads, const AttentionDropout* drop) {
  check_attention_heads(heads);
  const int NH = heads.q, hs = heads.size, G = heads.q / heads.kv;
  const int C = NH * hs;             // out's width
  const int C3 = heads.row_width();  // qkv's
  const int64_t k_cols = int64_t{NH} * hs, v_cols = k_cols + int64_t{heads.kv} * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool dropping = drop != nullptr && drop->p > 0.0f;
  const float keep_scale = dropping ? dropout_scale(drop->p) : 1.0f;
  const int nh_global = dropping && drop->n_head_global > 0 ? drop->n_head_global : NH;
  const int64_t TT = static_cast<int64_t>(T) * T;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* row = qkv + static_cast<int64_t>(b) * T * C3;
      const float* q = row + h * hs;
      const float* k = row + k_cols + (h / G) * hs;  // the key/value head of query head h
      const float* v = row + v_cols + (h / G) * hs;
      float* a = att + (static_cast<int64_t>(b) * NH + h) * TT;
      float* ad = dropping ? att_drop + (static_cast<int64_t>(b) * NH + h) * TT : a;
      float* o = out + static_cast<int64_t>(b) * T * C + h * hs;
      for (int r0 = 0; r0 < T; r0 += kAttentionBlock) {
        const int r1 = std::min(T, r0 + kAttentionBlock);
        const int rb = r1 - r0;
        // S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
        gemm(false, true, rb, r1, hs, scale, q + static_cast<int64_t>(r0) * C3, C3, k, C3, 0.0f,
             a + static_cast<int64_t>(r0) * T, T);
        for (int t = r0; t < r1; ++t) causal_softmax_row(a + static_cast<int64_t>(t) * T, t, r1);
        if (dropping) {
          const uint64_t g = static_cast<uint64_t>(drop->first_sample + b) * nh_global +
                             static_cast<uint64_t>(drop->head_offset + h);
          for (int t = r0; t < r1; ++t) {
            const float* src = a + static_cast<int64_t>(t) * T;
            float* dst = ad + static_cast<int64_t>(t) * T;
            const uint64_t base = (g * T + t) * T;
            for (int j = 0; j <= t; ++j)
              dst[j] = philox_uniform(drop->seed, drop->stream, base + j) > drop->p
                           ? src[j] * keep_scale
                           : 0.0f;
            for (int j = t + 1; j < r1; ++j) dst[j] = 0.0f;
          }
        }
        // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
        gemm(false, false, rb, hs, r1, 1.0f, ad + static_cast<int64_t>(r0) * T, T, v, C3, 0.0f,
             o + static_cast<int64_t>(r0) * C, C);
      }
    }
  }
}

int64_t attention_decode_scratch(int max_n, int64_t positions, const AttentionHeads& heads) {
  check_attention_heads(heads);
  // A block of up to kAttentionBlock queries, or one query's heads of a key/value head, by the
  // keys they see.
  return int64_t{std::max(std::min(max_n, kAttentionBlock), heads.q / heads.kv)} * positions;
}

void attention_decode(float* out, const float* q, int64_t ldq, const float* k, const float* v,
                      int64_t ldkv, int n, int64_t pos0, const AttentionHeads& heads,
                      float* scratch) {
  check_attention_heads(heads);
  TESSERA_CHECK_AS(ShapeError, n > 0 && pos0 >= 0, "attention_decode: ", n,
                   " new queries at position ", pos0);
  const int NH = heads.q, hs = heads.size, G = heads.q / heads.kv;
  const int64_t C = int64_t{NH} * hs;  // out's width
  const int lq = static_cast<int>(ldq), lkv = static_cast<int>(ldkv), ldo = static_cast<int>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  if (n == 1) {
    // One query: the G query heads of a key/value head are the rows of one [G, hs] matrix (they lie
    // side by side in the query row), so each key/value head is one pair of GEMMs.
    const int L = static_cast<int>(pos0 + 1);
    for (int g = 0; g < heads.kv; ++g) {
      const int64_t col = int64_t{g} * G * hs;
      gemm(false, true, G, L, hs, scale, q + col, hs, k + int64_t{g} * hs, lkv, 0.0f, scratch, L);
      for (int r = 0; r < G; ++r) causal_softmax_row(scratch + int64_t{r} * L, L - 1, L);
      gemm(false, false, G, hs, L, 1.0f, scratch, L, v + int64_t{g} * hs, lkv, 0.0f, out + col, hs);
    }
    return;
  }
  for (int h = 0; h < NH; ++h) {
    const float* kh = k + int64_t{h / G} * hs;  // the key/value head of query head h
    const float* vh = v + int64_t{h / G} * hs;
    for (int r0 = 0; r0 < n; r0 += kAttentionBlock) {
      const int r1 = std::min(n, r0 + kAttentionBlock), rb = r1 - r0;
      const int L = static_cast<int>(pos0 + r1);  // the keys the block's last query sees
      // S[0:rb, 0:L] = scale * Q[r0:r1] K[0:L]^T
      gemm(false, true, rb, L, hs, scale, q + int64_t{r0} * ldq + int64_t{h} * hs, lq, kh, lkv,
           0.0f, scratch, L);
      for (int t = 0; t < rb; ++t)
        causal_softmax_row(scratch + int64_t{t} * L, static_cast<int>(pos0) + r0 + t, L);
      // O[r0:r1] = P[0:rb, 0:L] V[0:L]
      gemm(false, false, rb, hs, L, 1.0f, scratch, L, vh, lkv, 0.0f,
           out + int64_t{r0} * C + int64_t{h} * hs, ldo);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* att,
                        const float* att_drop, const float* qkv, int B, int T,
                        const AttentionHeads& heads, float p) {
  check_attention_heads(heads);
  const int NH = heads.q, hs = heads.size, G = heads.q / heads.kv;
  const int C = NH * hs;
  const int C3 = heads.row_width();
  const int64_t k_cols = int64_t{NH} * hs, v_cols = k_cols + int64_t{heads.kv} * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool dropping = p > 0.0f && att_drop != nullptr;
  const float keep_scale = dropping ? dropout_scale(p) : 1.0f;
  const int64_t TT = static_cast<int64_t>(T) * T;
  float* dp = scratch;  // [T, T]: dP, then dS in place
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int64_t row = static_cast<int64_t>(b) * T * C3;
      const int64_t kv_off = (h / G) * hs;
      const float* q = qkv + row + h * hs;
      const float* k = qkv + row + k_cols + kv_off;
      const float* v = qkv + row + v_cols + kv_off;
      float* dq = dqkv + row + h * hs;
      float* dk = dqkv + row + k_cols + kv_off;
      float* dv = dqkv + row + v_cols + kv_off;
      // The first query head of a key/value head's group assigns its dK and dV; the others add.
      const bool first_of_group = h % G == 0;
      const float* a = att + (static_cast<int64_t>(b) * NH + h) * TT;
      const float* ad = dropping ? att_drop + (static_cast<int64_t>(b) * NH + h) * TT : a;
      const float* go = dout + static_cast<int64_t>(b) * T * C + h * hs;
      // Last block first: its keys span all of [0, T), so it assigns dK and dV (beta = 0) and
      // the earlier blocks accumulate into their prefixes.
      const int last_r0 = ((T - 1) / kAttentionBlock) * kAttentionBlock;
      for (int r0 = last_r0; r0 >= 0; r0 -= kAttentionBlock) {
        const int r1 = std::min(T, r0 + kAttentionBlock);
        const int rb = r1 - r0;
        const float beta = r1 == T && first_of_group ? 0.0f : 1.0f;
        const int64_t ro = static_cast<int64_t>(r0);
        // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T
        gemm(false, true, rb, r1, hs, 1.0f, go + ro * C, C, v, C3, 0.0f, dp + ro * T, T);
        // dV[0:r1] (+)= P'[r0:r1, 0:r1]^T dO[r0:r1]   (P' = dropped probabilities)
        gemm(true, false, r1, hs, rb, 1.0f, ad + ro * T, T, go + ro * C, C, beta, dv, C3);
        // Softmax backward row by row: dS = P * (dP - sum(P * dP)), zero above the diagonal.
        for (int t = r0; t < r1; ++t) {
          float* d = dp + static_cast<int64_t>(t) * T;
          const float* pr = a + static_cast<int64_t>(t) * T;
          if (dropping) {
            const float* pd = ad + static_cast<int64_t>(t) * T;
#pragma omp simd
            for (int j = 0; j <= t; ++j) d[j] = pd[j] != 0.0f ? d[j] * keep_scale : 0.0f;
          }
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int j = 0; j <= t; ++j) dot += pr[j] * d[j];
#pragma omp simd
          for (int j = 0; j <= t; ++j) d[j] = pr[j] * (d[j] - dot);
          for (int j = t + 1; j < r1; ++j) d[j] = 0.0f;
        }
        // dQ[r0:r1] = scale * dS[r0:r1, 0:r1] K[0:r1]
        gemm(false, false, rb, hs, r1, scale, dp + ro * T, T, k, C3, 0.0f, dq + ro * C3, C3);
        // dK[0:r1] (+)= scale * dS[r0:r1, 0:r1]^T Q[r0:r1]
        gemm(true, false, r1, hs, rb, scale, dp + ro * T, T, q + ro * C3, C3, beta, dk, C3);
      }
    }
  }
}

}  // namespace tessera::kernels
