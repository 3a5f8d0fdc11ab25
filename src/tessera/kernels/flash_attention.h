// Fused attention that never holds a T x T matrix (the FlashAttention-2 algorithm: Dao, 2023,
// arXiv:2307.08691). Queries are taken a tile at a time against tiles of keys with an online
// softmax (running maximum and sum); the forward saves each query row's log-sum-exp, from which the
// backward recomputes the probabilities tile by tile. Memory is O(T) per head: the output, the
// log-sum-exp and a few tiles of scratch per thread.
//
// Rows carry their global positions, so one call serves a whole sequence (positions 0..T-1), a
// context-parallel rank's load-balanced chunks against all keys (all-gather), one block of keys of
// a ring (merge), or a head-split full sequence (Ulysses). Causal: query i sees key j when
// k_pos[j] <= q_pos[i]; a tile pair whose keys all lie after its queries is skipped. Dropout on the
// probabilities draws the coordinate-keyed mask of kernels/attention.h (AttentionDropout) at global
// coordinates (sample, global head, q_pos, k_pos), so a recomputed or context-split mask is the
// single-device mask. The tile GEMMs run in fp32 whatever the calling thread's GEMM mode
// (kernels/precision.h): under bf16, rounding both operands of every tile cost more than the bf16
// product saved (docs/PERFORMANCE.md). The materialising kernel (kernels/attention.h) is the
// reference the tests hold this one to.
//
// Each call spreads its work over the calling rank's compute threads (openblas_get_num_threads, as
// kernels/parallel_rows.h): the forward in pieces of (sequence, head, 512 query rows), the backward
// in pieces of (sequence, key/value head) with all of that head's query heads. A piece writes its
// outputs alone and sums in a fixed order, so results are bitwise the same on any number of
// threads. Tile scratch: under 1 MB a thread at head size 64, outside the allocator's accounting,
// kept by the calling thread between calls (one set for the forward, one for the backward).
#pragma once

#include <cstdint>

#include "tessera/kernels/attention.h"

namespace tessera::kernels {

// One attention call: B sequences, each with Tq query rows and Tk key/value rows held here.
//   query row (b, i), head h:          q + (b * Tq + i) * ldq + h * heads.size
//   key (value) row (b, j), kv head g: k (v) + (b * Tk + j) * ldkv + g * heads.size
// Query head h attends with key/value head h / (heads.q / heads.kv) (grouped-query attention).
// Scale 1 / sqrt(heads.size).
struct FlashAttention {
  int B = 0, Tq = 0, Tk = 0;
  AttentionHeads heads;
  const float* q = nullptr;
  int64_t ldq = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ldkv = 0;
  // Global positions of the Tq query rows and the Tk key rows, the same for every sequence (null:
  // 0, 1, ..., in order).
  const int64_t* q_pos = nullptr;
  const int64_t* k_pos = nullptr;
  bool causal = true;
  // p = 0: no dropout. Mask element (sample first_sample + b, head head_offset + h, q_pos, k_pos)
  // uses index ((s * n_head_global + g) * L + q_pos) * L + k_pos, L = drop.seq_len (0: Tq).
  AttentionDropout drop;
};

// Forward. out row (b, i), head h: out + (b * Tq + i) * ldo + h * heads.size; lse[(b * heads.q +
// h) * Tq + i] = log sum_j exp(score_ij) over the keys the row sees (natural log, scaled scores).
// merge = false: ASSIGNS out and lse over this call's keys. merge = true: out and lse hold the
// result over other keys (normalised output and its log-sum-exp; 0 and -inf where none) and
// become the result over those keys and this call's (a ring's next block). A query row that sees
// no key gets out 0 and lse -inf.
void flash_attention_forward(const FlashAttention& a, float* out, int64_t ldo, float* lse,
                             bool merge = false);

// delta[(b * heads.q + h) * Tq + i] ASSIGNED = sum over the head's columns of dout * out (the
// softmax backward's row term; it holds with dropout too). Once per backward: every block of a
// ring reuses it.
void flash_attention_delta(float* delta, const float* out, int64_t ldo, const float* dout,
                           int64_t lddo, int B, int Tq, const AttentionHeads& heads);

// Backward of this call's keys given the whole attention's lse (after every merge), delta and dout
// (laid out as out): ACCUMULATES dq (laid out as q, stride lddq), dk and dv (laid out as k and v,
// stride lddkv; a key/value head sums its query heads'). The caller zeroes them first.
void flash_attention_backward(const FlashAttention& a, const float* dout, int64_t lddo,
                              const float* lse, const float* delta, float* dq, int64_t lddq,
                              float* dk, float* dv, int64_t lddkv);

}  // namespace tessera::kernels
