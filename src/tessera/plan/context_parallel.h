// What context parallelism (docs/ARCHITECTURE.md decision 42) costs one rank per attention layer
// and micro-batch: the bytes each --cp-comm variant sends (the formulas of
// nn/context_parallel_attention.h, which the communicators' traffic counters confirm: tested), the
// transient buffers a call holds (what nn/context_parallel_attention.cc allocates, Buffers of the
// rank's allocator: tested against a real call's peak), and the exchanges' time on a cluster's
// links with what of it hides behind the attention core's compute:
//   allgather  an all-gather of K and V before the kernel, in the backward the all-gather again and
//              a reduce-scatter of dK, dV after it: all exposed (the kernel waits for them);
//   ring       n - 1 K/V blocks passed to the next rank while the kernel computes with the held
//              block (exposed per step: max(0, transfer - the block's compute)); in the backward
//              the blocks again and each held block's dK/dV part to its owner (during the next
//              step), two transfers a step, the last part's hop exposed;
//   ulysses    all-to-alls to head-split and back around the kernel: all exposed.
// A rank holds R = B s / n rows of the micro-batch (B sequences of s tokens), the key/value and
// query columns of its tensor-parallel heads.
#pragma once

#include "tessera/nn/gpt_config.h"
#include "tessera/plan/cluster.h"
#include "tessera/plan/collectives.h"
#include "tessera/plan/layout.h"
#include "tessera/plan/model_spec.h"

namespace tessera::plan {

// One rank's attention core under context parallelism.
struct CpShape {
  int n = 1;  // cp ranks
  nn::CpComm comm = nn::CpComm::AllGather;
  int batch = 0;                     // B, sequences of the micro-batch
  double rows = 0;                   // R = B s / n
  int q = 0, kv = 0, head_size = 0;  // query and key/value heads of this tensor-parallel rank, D
  double elem = 4;                   // bytes of an exchanged element (tessera: fp32)
  // Ring's backward: dK/dV accumulators that travel the ring, n hops each (Megatron's
  // TransformerEngine), or, as tessera, each held block's part sent to its owner (n - 1).
  bool travelling_accumulators = false;
  // Memory the attention's caller lends the call (nn::ContextAttention::lent; tessera: the block
  // workspace's d_fc, B s / n x the MLP's hidden width / tp elements), in elements: the ring's
  // blocks that fit in it whole are not allocated. lent_delta: the backward's row term is lent too
  // (the workspace's delta).
  double lent = 0;
  bool lent_delta = false;
  // Ulysses' head split: query heads per rank and the key/value heads each receives (kv / n, or
  // one, replicated, when n exceeds them).
  int ulysses_q() const { return q / n; }
  int ulysses_kv() const { return kv % n == 0 ? kv / n : 1; }
};
CpShape cp_shape(const ModelSpec& m, const Layout& l, double elem_bytes);

// Bytes this rank sends (the ring convention of comm's traffic counters) in one forward and one
// backward call of the attention core; zero without context parallelism.
struct CpBytes {
  double fwd = 0, bwd = 0;
};
CpBytes cp_layer_bytes(const CpShape& s);

// The most bytes of transient buffers one forward and one backward call hold at once: allgather
// the whole sequence's K and V (with B > 1 a copy in sequence order) and in the backward their
// gradients, ring two K/V blocks and in the backward K/V blocks and dK/dV parts (two blocks at
// n = 2, four at n = 3, five from n = 4) less those that fit in the lent memory, ulysses the
// head-split rows and the all-to-all buffers. 0 without context parallelism.
struct CpTransient {
  double fwd = 0, bwd = 0;
};
CpTransient cp_transient_bytes(const CpShape& s);

// A mixture-of-experts layer's forward under context parallelism all-gathers each rank's
// positions and top-k choices (int32; nn/moe.cc): what one rank contributes, in bytes.
double cp_routing_chunk_bytes(const ModelSpec& m, const Layout& l);

// One attention layer's exchanges on the cp group `g` of cluster `c`, given the seconds of the
// attention core's forward and backward compute on this rank (the window a ring hides behind).
struct CpTime {
  double fwd_comm = 0, fwd_exposed = 0;  // forward (and a recomputation's forward)
  double bwd_comm = 0, bwd_exposed = 0;
};
CpTime cp_layer_seconds(const ClusterSpec& c, const Group& g, const CpShape& s, double core_fwd,
                        double core_bwd);

}  // namespace tessera::plan
