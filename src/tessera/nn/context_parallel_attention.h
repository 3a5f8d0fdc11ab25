// The attention core of a micro-batch whose sequences are split over a context-parallel group
// (nn/context_parallel.h; docs/ARCHITECTURE.md decision 42): the one place where the cp ranks of a
// sequence meet. Each rank holds its T rows of every sequence (its load-balanced chunks, at global
// positions) with their q, k and v columns (qkv rows [q heads | kv heads | kv heads], as the
// attention modules keep them); the result is exactly the single-rank attention of those rows over
// the whole sequence, causal by global position, its dropout mask drawn at global coordinates.
// Every variant runs the fused kernel (kernels/flash_attention.h), which takes the rows' positions,
// so no rank reorders a sequence.
//
// Variants (CpComm, --cp-comm), n ranks, per layer and micro-batch, with R = B T rows here,
// KV = kv heads x head size and Q = query heads x head size of this (tensor-parallel) rank, 4-byte
// floats; bytes this rank sends:
//   AllGather  forward: all-gather K and V (2 KV R floats; this rank sends (n - 1) x that in the
//              ring convention of comm's traffic counters: 8 KV R (n - 1) bytes), local queries
//              against every key in one kernel call. Backward: the all-gather again (nothing of
//              it is kept), then dK and dV of every key reduce-scattered to their owners
//              (8 KV R (n - 1) bytes). Total 24 KV R (n - 1) bytes; it holds the whole
//              sequence's K and V (2 KV n R floats) during a call.
//   Ring       forward: n - 1 steps, each passing the K and V block it holds to the next rank
//              (send/recv, posted asynchronously before computing with the block it has, so the
//              transfer hides behind the kernel) and merging that block's result by log-sum-exp
//              (the kernel's merge mode): 8 KV R (n - 1) bytes. Backward: the K/V blocks travel
//              the ring again (8 KV R (n - 1)); the dK/dV of each held block goes straight to its
//              owner (posted after the step's kernel, travelling during the next step's), which
//              adds the n - 1 parts to its own in step order, the sum a travelling accumulator
//              would carry (8 KV R (n - 1)). Total 8 KV R (3n - 3) bytes; two K/V blocks held in
//              the forward, in the backward two blocks at n = 2, four at n = 3, five from n = 4:
//              memory O(R), whatever n; blocks that fit in the memory the caller lends (`lent`)
//              are not allocated (in a GPT-2 block's d_fc, R x 4C floats, two of them: at n = 2
//              the ring allocates nothing).
//   Ulysses    forward: all-to-all of q, k, v from sequence-split to head-split (each rank then
//              holds Q / n query columns and their key/value columns KV_n of the whole sequence),
//              one kernel call over the whole sequence, all-to-all of the output back:
//              4 (n - 1) R (2 Q / n + 2 KV_n) bytes. Backward: q, k, v again, the output gradient
//              and the softmax row term (one float per head and row) to head-split, dq, dk, dv
//              back: 4 (n - 1) R (3 Q / n + 4 KV_n + Q / (D n)) bytes, D the head size. KV_n is
//              KV / n, or one head (D) when n exceeds the key/value heads. Needs n to divide the
//              query heads of a rank; with grouped-query heads, n must divide the key/value heads
//              or be a multiple of them -- then the n / kv ranks whose query heads read one
//              key/value head each receive it (replicated) and their partial dK, dV are summed at
//              the owner (in rank order).
// The log-sum-exp a forward returns (and its backward reads) is [B, Q / D, T] for AllGather and
// Ring, as the single-rank core's; Ulysses keeps it in its head-split layout, [B, Q / (D n), n T],
// the same number of floats.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/kernels/attention.h"
#include "tessera/nn/context_parallel.h"

namespace tessera::nn {

// One core call: this rank's B x T rows of sequences of seq_len tokens at `positions` (its
// load-balanced ones, context_positions(seq_len, n, rank): a ShapeError otherwise), its heads
// (the global index of the first and the global count: dropout coordinates), dropout (p = 0: none;
// seed, stream, first_sample as kernels::AttentionDropout).
struct ContextAttention {
  const ContextSplit* cp = nullptr;
  int B = 0, T = 0;
  int64_t seq_len = 0;
  const int64_t* positions = nullptr;  // [T]
  kernels::AttentionHeads heads;
  int head_offset = 0, n_head = 0;
  kernels::AttentionDropout drop;  // head_offset, n_head_global and seq_len are filled here
  std::string label;               // the layer, for the timeline ("h.3")
  // Memory the caller lends the call, which nothing else reads or writes while it runs (a block's
  // MLP gradient scratch, BlockWorkspace::dfch: dead during the attention core). The ring keeps
  // its K/V blocks and dK/dV parts in as many whole blocks of it as fit (2 KV R floats each) and
  // allocates only the rest; the other variants allocate theirs. lent_delta: [B, heads.q, T]
  // floats for the backward's softmax row term (BlockWorkspace::delta), every variant; null:
  // allocated.
  float* lent = nullptr;
  int64_t lent_floats = 0;
  float* lent_delta = nullptr;
};

// ConfigError unless the variant can split these heads over n ranks (Ulysses' rule above).
void check_context_heads(CpComm comm, int n, const kernels::AttentionHeads& heads);

// ASSIGNS atty[B T, heads.q * heads.size] and lse (see above) from qkv[B T, heads.row_width()].
// Collective over the cp group.
void context_attention_forward(const ContextAttention& a, const float* qkv, float* atty,
                               float* lse);
// Given datty (laid out as atty) and the forward's atty and lse: ASSIGNS dqkv (laid out as qkv).
// Collective over the cp group.
void context_attention_backward(const ContextAttention& a, const float* qkv, const float* atty,
                                const float* lse, const float* datty, float* dqkv);

}  // namespace tessera::nn
