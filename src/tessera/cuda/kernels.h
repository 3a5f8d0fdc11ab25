// The GPU kernels of a GPT, with the CPU kernels' contracts (kernels/*.h): the same formulas, the
// same ASSIGNS / ACCUMULATES conventions, the same coordinate-keyed dropout. Activations are of
// type T, float or bf16 (__nv_bfloat16); every kernel computes in fp32 and rounds once on store.
// Parameters, their gradients and the optimizer state are always fp32. Every function launches on
// `stream` and returns at once (asynchronous), except those that say they synchronise; a launch
// failure throws tessera::Error naming the kernel.
//
// Determinism: every reduction runs in a fixed order (per-block partial sums in scratch, then one
// pass over the partials), except the token-embedding gradient, which adds rows with atomics (the
// order of additions into one row varies from run to run by rounding only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::cuda {

using bf16 = __nv_bfloat16;

// ---- Conversions and fills ---------------------------------------------------------------------
// ASSIGNS out[n] = bf16(in[n]), rounded to nearest even (as kernels/bf16.h).
void convert(bf16* out, const float* in, int64_t n, cudaStream_t stream);
// ASSIGNS out[n] = float(in[n]).
void convert(float* out, const bf16* in, int64_t n, cudaStream_t stream);
// ASSIGNS x[n] *= s.
void scale(float* x, int64_t n, float s, cudaStream_t stream);

// ---- Embedding (kernels/embedding.h) ----------------------------------------------------------
// ASSIGNS out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]. tokens already validated in [0, V).
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T_, int C, cudaStream_t stream);
// ACCUMULATES dwte[V,C] += scatter of dout by token (atomics), dwpe[t] += sum over b of dout[b,t]
// (fixed order). Either may be null.
template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B,
                        int T_, int C, cudaStream_t stream);

// ---- LayerNorm (kernels/layernorm.h): two passes, biased variance, eps inside the root --------
// ASSIGNS out[N,C] and mean[N], rstd[N]. out must not alias in.
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* in, const float* weight,
                       const float* bias, int N, int C, float eps, cudaStream_t stream);
// din[N,C] += d/d(in) (ACCUMULATES, as the CPU kernel: din is the residual stream's gradient);
// dweight[C] +=, dbias[C] += (ACCUMULATE, fixed order through scratch). scratch: at least
// layernorm_backward_scratch(N, C) floats.
template <typename T>
void layernorm_backward(T* din, float* dweight, float* dbias, const T* dout, const T* in,
                        const float* weight, const float* mean, const float* rstd, int N, int C,
                        float* scratch, cudaStream_t stream);
int64_t layernorm_backward_scratch(int N, int C);

// ---- GELU, tanh approximation (kernels/gelu.h) -------------------------------------------------
// ASSIGNS out[n] = gelu(in[n]); out may alias in.
template <typename T>
void gelu_forward(T* out, const T* in, int64_t n, cudaStream_t stream);
// ASSIGNS din[n] = gelu'(in[n]) * dout[n]; din may alias dout.
template <typename T>
void gelu_backward(T* din, const T* dout, const T* in, int64_t n, cudaStream_t stream);

// ---- Residual and bias (kernels/residual.h) ----------------------------------------------------
// ASSIGNS out[n] = a[n] + b[n]; out may alias a or b.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream);
// ACCUMULATES out[n] += in[n].
template <typename T>
void accumulate(T* out, const T* in, int64_t n, cudaStream_t stream);
// The bias of a product fused into the pass after it. ASSIGNS out[M,N] = residual + (in + bias)
// (in fp32, rounded once; out may alias in or residual).
template <typename T>
void bias_residual_forward(T* out, const T* in, const float* bias, const T* residual, int64_t M,
                           int N, cudaStream_t stream);
// pre[M,N] += bias (rounded: what the backward's GELU reads), then ASSIGNS out = gelu(pre).
template <typename T>
void gelu_bias_forward(T* pre, T* out, const float* bias, int64_t M, int N, cudaStream_t stream);
// out[M,N] += bias[N] (in place).
template <typename T>
void add_bias(T* out, const float* bias, int64_t M, int N, cudaStream_t stream);
// ACCUMULATES dbias[N] += column sums of dout[M,N], in a fixed order through scratch (at least
// column_sum_scratch(M, N) floats).
template <typename T>
void bias_backward(float* dbias, const T* dout, int64_t M, int N, float* scratch,
                   cudaStream_t stream);
int64_t column_sum_scratch(int64_t M, int N);

// ---- Dropout (kernels/dropout.h) ---------------------------------------------------------------
// Rows [first_row, first_row + rows) of the step's [samples * T, C] activation: element (row, c)
// is kept when philox_uniform(seed, stream_id, (first_row + row) * C + c) > p (core/philox.h,
// bitwise the CPU's draw) and then scaled by 1 / (1 - p). p == 0: a copy (or nothing in place).
// ASSIGNS out; out may alias in.
template <typename T>
void dropout_forward(T* out, const T* in, int64_t rows, int C, float p, uint64_t seed,
                     uint64_t stream_id, int64_t first_row, cudaStream_t stream);
// ASSIGNS din = dout * keep / (1 - p), the mask redrawn from the same coordinates; din may alias
// dout.
template <typename T>
void dropout_backward(T* din, const T* dout, int64_t rows, int C, float p, uint64_t seed,
                      uint64_t stream_id, int64_t first_row, cudaStream_t stream);

// ---- Attention on materialised scores (kernels/attention.h's layout) --------------------------
// Heads: qkv[B, T, 3C] (queries, keys, values; head h owns columns [h hs, (h+1) hs) of each) to
// q, k, v[B, NH, T, hs], and back.
// bias (null: none) [3C]: the c_attn bias added on the way (the product's output without it).
template <typename T>
void split_qkv_heads(T* q, T* k, T* v, const T* qkv, int B, int T_, int NH, int hs,
                     cudaStream_t stream, const float* bias = nullptr);
// ASSIGNS dqkv[B, T, 3C] from dq, dk, dv[B, NH, T, hs].
template <typename T>
void merge_qkv_heads(T* dqkv, const T* dq, const T* dk, const T* dv, int B, int T_, int NH, int hs,
                     cudaStream_t stream);
// ASSIGNS out[B, T, NH hs] from y[B, NH, T, hs] (heads concatenated), and the inverse.
template <typename T>
void merge_heads(T* out, const T* y, int B, int T_, int NH, int hs, cudaStream_t stream);
template <typename T>
void split_heads(T* y, const T* x, int B, int T_, int NH, int hs, cudaStream_t stream);

// Attention-probability dropout (Hugging Face's attn_dropout): element (b, h, t, j) uses index
// ((first_sample + b) * NH + h) * T + t) * T + j, as kernels::AttentionDropout with head_offset 0
// and n_head_global NH.
struct AttnDropout {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream_id = 0;
  int64_t first_sample = 0;
};
// scores[B*NH, T, T] (row t: query t against every key). ASSIGNS att[., t, j] = softmax over
// j <= t of scale * scores, and 0 for j > t (the product with the values reads whole rows).
// att may alias scores. With drop.p > 0 also ASSIGNS att_drop = att * keep / (1 - p) (0 where
// dropped and above the diagonal); att_drop unused (may be null) when p == 0.
template <typename T>
void causal_softmax_forward(T* att, T* att_drop, const T* scores, int B, int NH, int T_,
                            float scale, const AttnDropout& drop, cudaStream_t stream);
// Given datt = dL/d(att_drop) (or dL/d(att) without dropout): ASSIGNS dscores[., t, j] =
// scale * att * (g - sum_j' att g) with g = datt * keep / (1 - p) (the mask redrawn), 0 for
// j > t. dscores may alias datt.
template <typename T>
void causal_softmax_backward(T* dscores, const T* datt, const T* att, int B, int NH, int T_,
                             float scale, const AttnDropout& drop, cudaStream_t stream);

// ---- Loss (kernels/softmax_xent.h) -------------------------------------------------------------
// logits[N, V], rows ld >= V elements apart (0: V; a padded row keeps the GEMMs' leading
// dimension aligned); targets[N] in [-1, V) (-1: ignored). ASSIGNS losses[N] = logsumexp - logit
// of the target (0 for -1) and, in place, logits[n] = (softmax - onehot(target)) * scale (a zero
// row for -1): the forward and the backward in one pass over the logits. Columns [V, ld) are not
// touched.
template <typename T>
void softmax_xent_forward_backward(T* logits, float* losses, const int32_t* targets, float scale,
                                   int N, int V, cudaStream_t stream, int ld = 0);
// The forward alone (evaluation): ASSIGNS losses[N]; logits unchanged.
template <typename T>
void softmax_xent_forward(float* losses, const T* logits, const int32_t* targets, int N, int V,
                          cudaStream_t stream, int ld = 0);

// ---- Optimizer (optim/adamw.h) -----------------------------------------------------------------
// One AdamW step over the segments of a flat buffer: segment i is elements
// [begin[i], begin[i] + length[i]), with weight decay when decay[i] != 0; elements outside every
// segment (alignment padding) are untouched. The three arrays live on the device, sorted by
// begin, not overlapping. The formula is optim::adamw_update's, with its c1, c2 computed on the
// host as there: bitwise the CPU's update of the same inputs, to the rounding of sqrt and the
// division.
struct AdamwArgs {
  float lr = 0.0f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  int64_t t = 1;  // 1-based step
};
void adamw_step(float* param, float* m, float* v, const float* grad, const int64_t* begin,
                const int64_t* length, const uint8_t* decay, int segments, int64_t flat_n,
                const AdamwArgs& a, cudaStream_t stream);

// ---- Reductions --------------------------------------------------------------------------------
// Returns sum of x[i]^2 in double, in a fixed order; SYNCHRONISES the stream. scratch: at least
// sum_squares_scratch(n) doubles.
double sum_squares(const float* x, int64_t n, double* scratch, cudaStream_t stream);
int64_t sum_squares_scratch(int64_t n);
// Returns sum of x[i] in double (per-token losses), in a fixed order; SYNCHRONISES. Same scratch.
double sum(const float* x, int64_t n, double* scratch, cudaStream_t stream);

}  // namespace tessera::cuda
