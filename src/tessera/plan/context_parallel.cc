#include "tessera/plan/context_parallel.h"

#include <algorithm>
#include <cmath>

namespace tessera::plan {

CpShape cp_shape(const ModelSpec& m, const Layout& l, double elem_bytes) {
  const nn::GPTConfig c = to_gpt_config(m);
  CpShape s;
  s.n = l.cp;
  s.comm = l.cp_comm;
  s.batch = l.micro_batch;
  s.rows = static_cast<double>(l.micro_batch) * m.seq / l.cp;
  s.q = c.n_head / l.tp;
  s.kv = c.kv_heads() / l.tp;
  s.head_size = c.head_dim();
  s.elem = elem_bytes;
  return s;
}

namespace {

// Widths in elements: both K and V of this rank's key/value heads; Ulysses' head-split row
// (q | k | v of its heads) and output row.
double kv2(const CpShape& s) {
  return 2.0 * s.kv * s.head_size;
}
double ulysses_row(const CpShape& s) {
  return static_cast<double>(s.ulysses_q() + 2 * s.ulysses_kv()) * s.head_size;
}
double ulysses_out(const CpShape& s) {
  return static_cast<double>(s.ulysses_q()) * s.head_size;
}

}  // namespace

CpBytes cp_layer_bytes(const CpShape& s) {
  if (s.n <= 1) return {};
  const double n = s.n, R = s.rows, e = s.elem;
  switch (s.comm) {
    case nn::CpComm::AllGather:  // K, V gathered; backward again, and dK, dV reduce-scattered
      return {(n - 1) * R * kv2(s) * e, 2 * (n - 1) * R * kv2(s) * e};
    case nn::CpComm::Ring:  // n - 1 blocks; backward n - 1 blocks and n - 1 dK/dV parts (or n
                            // accumulator hops)
      return {(n - 1) * R * kv2(s) * e,
              (s.travelling_accumulators ? 2 * n - 1 : 2 * n - 2) * R * kv2(s) * e};
    case nn::CpComm::Ulysses: {  // q, k, v out and the output back; backward q, k, v, dO and the
                                 // row term out, dq, dk, dv back
      const double w = ulysses_row(s), o = ulysses_out(s), rowterm = s.ulysses_q();
      return {(n - 1) * R * (w + o) * e, (n - 1) * R * (2 * w + o + rowterm) * e};
    }
  }
  return {};
}

CpTransient cp_transient_bytes(const CpShape& s) {
  if (s.n <= 1) return {};
  const double n = s.n, R = s.rows, e = s.elem, KV2 = kv2(s), delta = s.lent_delta ? 0 : R * s.q;
  switch (s.comm) {
    case nn::CpComm::AllGather: {
      // Forward: this rank's K, V and the gathered ones (B > 1: and their copy in sequence order,
      // the gathered block freed when the call's K, V are returned). Backward, at the
      // reduce-scatter: the whole sequence's K, V again, delta, their gradients (B > 1: and in
      // rank order), this rank's share.
      const double reorder = s.batch > 1 ? 1 : 0;
      return {e * R * KV2 * (1 + (1 + reorder) * n),
              e * (R * KV2 * (1 + (2 + reorder) * n) + delta)};
    }
    case nn::CpComm::Ring: {
      // Two K/V blocks. Backward, with delta: at n = 2 two blocks (the held and the incoming K/V
      // blocks, later the part going to its owner and the one coming); at n = 3 four (the held
      // block, this step's part and the previous one's, going and coming); from n = 4 five (the
      // incoming block as well).
      // Blocks that fit in the lent memory whole are not allocated (nn's BlockPool: a block takes
      // a free lent one first, so at most the blocks held at once less the lent ones are).
      const double blocks = s.n == 2 ? 2 : s.n == 3 ? 4 : 5;
      const double lent = R * KV2 > 0 ? std::floor(s.lent / (R * KV2)) : 0;
      return {e * std::max(0.0, 2 - lent) * R * KV2,
              e * (std::max(0.0, blocks - lent) * R * KV2 + delta)};
    }
    case nn::CpComm::Ulysses: {
      const double N = n * R, w = ulysses_row(s), o = ulysses_out(s);
      // Forward: q, k, v head-split with the all-to-all's send and receive buffers, or them, the
      // head-split output and its all-to-all's buffers. Backward, at the last all-to-all (dq, dk,
      // dv back): q, k, v and dO head-split, delta and its head-split copy, the head-split
      // gradients, and the send and receive buffers.
      return {e * N * std::max(3 * w, w + 3 * o), e * (N * (4 * w + o + s.ulysses_q()) + delta)};
    }
  }
  return {};
}

double cp_routing_chunk_bytes(const ModelSpec& m, const Layout& l) {
  if (l.cp <= 1 || !m.moe.enabled()) return 0;
  const double T = static_cast<double>(m.seq) / l.cp;
  return 4 * (T + l.micro_batch * T * m.moe.top_k);  // [T positions | B T k choices]
}

CpTime cp_layer_seconds(const ClusterSpec& c, const Group& g, const CpShape& s, double core_fwd,
                        double core_bwd) {
  CpTime t;
  if (s.n <= 1) return t;
  const double n = s.n, R = s.rows, e = s.elem;
  switch (s.comm) {
    case nn::CpComm::AllGather: {
      const double whole = n * R * kv2(s) * e;  // the gathered K and V (and their gradients)
      t.fwd_comm = all_gather_seconds(c, g, whole);
      t.bwd_comm = t.fwd_comm + reduce_scatter_seconds(c, g, whole);
      t.fwd_exposed = t.fwd_comm;
      t.bwd_exposed = t.bwd_comm;
      break;
    }
    case nn::CpComm::Ring: {
      // One block to the next rank; a ring that leaves the node is as slow as its network hops.
      const double hop = p2p_seconds(c, g.nodes() <= 1, R * kv2(s) * e);
      const double fwd_block = core_fwd / n, bwd_block = core_bwd / n;
      t.fwd_comm = (n - 1) * hop;
      t.fwd_exposed = (n - 1) * std::max(0.0, hop - fwd_block);
      // Backward step i: K/V block i + 1 travels (i < n - 1) and step i - 1's dK/dV part to its
      // owner (i >= 2; a travelling accumulator: i >= 1) while the kernel computes block i; the
      // last part's (accumulator's) hop follows the last block.
      const int first_part = s.travelling_accumulators ? 1 : 2;
      t.bwd_comm = (s.travelling_accumulators ? 2 * n - 1 : 2 * n - 2) * hop;
      for (int i = 0; i < s.n; ++i) {
        const int transfers = (i + 1 < s.n ? 1 : 0) + (i >= first_part ? 1 : 0);
        t.bwd_exposed += std::max(0.0, transfers * hop - bwd_block);
      }
      t.bwd_exposed += hop;
      break;
    }
    case nn::CpComm::Ulysses: {
      // An all-to-all's S is what a rank sends in all, its own block included: n R x the width.
      auto a2a = [&](double width) { return all_to_all_seconds(c, g, n * R * width * e); };
      const double w = ulysses_row(s), o = ulysses_out(s);
      t.fwd_comm = a2a(w) + a2a(o);
      t.bwd_comm = 2 * a2a(w) + a2a(o) + a2a(s.ulysses_q());
      t.fwd_exposed = t.fwd_comm;
      t.bwd_exposed = t.bwd_comm;
      break;
    }
  }
  return t;
}

}  // namespace tessera::plan
