// The tessera engine: this code base's memory, to the byte, and its work (docs/PLANNER.md).
// A stage's parameters (padding included), its activation record, workspace and zero-bubble copies
// are measured by building the stage against an allocator of address space only (measure.h), so
// they follow the code; a mixture of experts' routed rows depend on the routing and are modelled.
// Each model chunk keeps the records of its most micro-batches in flight (the executor's pool
// never shrinks). Transients: ZeRO-2/3 gradient buckets and ZeRO-3 gathered buckets
// (data_parallel.cc keeps at most two reductions pending and prefetches one bucket), the
// embedding group's gradient copy, the head's statistics, and under context parallelism the
// attention's transient buffers (plan/context_parallel.h: the whole sequence's keys and values for
// allgather, K/V blocks and dK/dV parts for ring, the head-split rows for ulysses), whose
// backward's coexist with the ZeRO buckets of that backward. A stage built over a cp group of n
// sizes its records and workspace for s / n rows of each sequence, so the measurement divides
// them by n itself.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "tessera/plan/engine.h"
#include "tessera/plan/measure.h"
#include "tessera/plan/work.h"

namespace tessera::plan {

namespace {

WorkRules tessera_rules() {
  WorkRules r;
  r.act_bytes = 4;
  r.score_bytes = 4;
  r.logit_bytes = 4;
  r.causal_blocks = true;
  r.fused_attention = true;
  r.recompute_skips_last_projection = true;
  r.recompute_tp_collectives = 1;
  r.experts_split_over_tp = false;
  r.moe_pads_to_capacity = false;
  return r;
}

class TesseraEngine final : public Engine {
 public:
  std::string name() const override { return "tessera"; }
  Numerics numerics() const override {
    Numerics n;
    n.param = 4;
    n.grad = 4;
    n.optimizer = options.sgd ? 4 : 8;
    n.comm = options.grad_comm_bytes;
    n.replica_comm = 4;  // fp32 whatever the reduce-scatter's wire (zero.cc, reduce_over_replicas)
    n.gather = options.param_gather_bytes;
    n.activation = options.activation_comm_bytes;
    // AdamW reads p, g, m, v and writes p, m, v; the norm reads g, clipping rewrites it, the next
    // step zeroes it.
    n.optimizer_traffic = options.sgd ? 32 : 44;
    return n;
  }
  bool uneven_stages() const override { return true; }

  std::vector<parallel::UnitRange> split(const ModelSpec& m, const Layout& l) const override {
    return parallel::pipeline_split(to_gpt_config(m), m.seq, l.pp * l.virtual_stages, "");
  }

  StageSheet stage(const ModelSpec& m, const Layout& l,
                   const parallel::UnitRange& units) const override {
    StageSheet s;
    s.units = units;
    const int L = m.layers;
    s.has_embedding = units.first == 0;
    s.has_head = units.last == L + 1;
    for (int u = std::max(units.first, 1); u <= std::min(units.last, L); ++u) ++s.blocks;

    // Parameters and activations as the code allocates them (plan/measure.h).
    const StageMeasure got = measured(m, l, units);
    s.unit_elems = got.unit_elems;
    s.dense_elems = got.dense_elems;
    s.expert_elems = got.expert_elems;
    s.tied_wte_elems = l.pp > 1 ? got.tied_wte_elems : 0;
    s.sequence_partial_elems = got.sequence_partial_elems;
    s.bf16_copy_bytes = got.bf16_copy_bytes;
    s.record_bytes = got.record_bytes;
    s.workspace_bytes = got.workspace_bytes;
    s.deferred_bytes = parallel::traits(l.schedule_kind()).splits_backward ? got.deferred_bytes : 0;
    if (got.moe_blocks > 0) add_routed_rows(s, m, l, got.moe_blocks);

    // Work.
    WorkRules rules = tessera_rules();
    if (!options.gemm_efficiency.empty()) {
      if (!(gemm_.table() == options.gemm_efficiency))
        gemm_ = GemmEfficiencyCache(options.gemm_efficiency);
      rules.gemm = &gemm_;
      if (!options.attention_efficiency.empty()) rules.attention = &options.attention_efficiency;
      rules.moe_skew = options.moe_skew;
    }
    add_unit_work(s, m, l, rules, 4);  // keys, values and their gradients travel in fp32
    if (s.cp_cores > 0) {
      // The attention core is lent the block workspace's d_fc (micro-batch rows x the MLP's
      // hidden width / tp) for the ring's blocks, and its delta for the backward's row term.
      s.cp.lent = s.cp.rows * static_cast<double>(to_gpt_config(m).mlp_hidden() / l.tp);
      s.cp.lent_delta = true;
      s.cp_transient = cp_transient_bytes(s.cp);
    }
    const double tokens = local_tokens(m, l);
    s.tp_bytes = options.activation_comm_bytes * tokens * m.hidden;
    // A hidden state passed between stages: this rank's rows under sequence parallelism.
    const double rows = l.sp && l.tp > 1 ? std::ceil(tokens / l.tp) : tokens;
    s.boundary_bytes = options.activation_comm_bytes * rows * m.hidden;
    return s;
  }

  MemoryTerms rank_memory(const ModelSpec& m, const Layout& l,
                          const std::vector<StageSheet>& chunks,
                          const std::vector<int>& chunk_peaks, double,
                          int micro_batches) const override {
    MemoryTerms total;
    const Numerics n = numerics();
    double transient = 0;
    std::vector<BucketPeaks> zero(chunks.size());
    for (size_t c = 0; c < chunks.size(); ++c)
      zero[c] = zero_transient(chunks[c], m, l, micro_batches);
    double pending = 0;
    for (const BucketPeaks& z : zero) pending += z.pending;
    bool receives_gradients = false;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const StageSheet& s = chunks[c];
      add_model_states(total, s, l, n);
      total.activations += s.workspace_bytes + chunk_peaks[c] * (s.record_bytes + s.deferred_bytes);
      // This chunk's buckets (and context-parallel buffers) at their peak, the other chunks'
      // reductions still pending.
      transient = std::max(transient, zero[c].peak + pending - zero[c].pending);
      transient = std::max(transient, 4 * s.tied_wte_elems);  // embedding-group gradient copy
      if (s.has_head && l.tp > 1) transient = std::max(transient, 8.0 * local_tokens(m, l));
      if (!s.has_head) receives_gradients = true;
    }
    if (l.pp > 1) {  // pipeline/step_executor.cc's buffers: the fp32 output-gradient buffer (an
      // fp32 send goes straight from the record); one bf16 receive and one bf16 send buffer
      const double a = options.activation_comm_bytes, elems = chunks.front().boundary_bytes / a;
      total.activations += (receives_gradients ? 4 * elems : 0) + (a < 4 ? 2 * a * elems : 0);
    }
    total.buffers = transient;
    // A bf16 tensor-parallel collective's wire (nn/wire.h: [B*T, C] rounded to bf16) exists while
    // the collective runs, on top of whatever else is alive then.
    if (l.tp > 1 && options.activation_comm_bytes < 4)
      total.buffers += options.activation_comm_bytes * local_tokens(m, l) * m.hidden;
    return total;
  }

 private:
  // The measurement of one stage, made once per stage shape (a ranking asks for the same stages
  // under many layouts).
  StageMeasure measured(const ModelSpec& m, const Layout& l, const parallel::UnitRange& u) const {
    if (!(m == measured_model_)) measures_.clear(), measured_model_ = m;
    // What a measurement depends on; dp and the ZeRO stage are applied to it (pad_units).
    const auto key = std::make_tuple(u.first, u.last, u.starts_mid_block, u.ends_mid_block, l.tp,
                                     l.sp, l.ep, l.micro_batch, static_cast<int>(l.recompute), l.cp,
                                     static_cast<int>(l.cp_comm));
    auto it = measures_.find(key);
    if (it == measures_.end()) {
      Layout unsharded = l;
      unsharded.zero = parallel::ZeroStage::None;
      it = measures_.emplace(key, measure_stage(m, unsharded, u, options)).first;
    }
    return pad_units(it->second, l);
  }

  // A mixture of experts' routed rows, which grow with the routing (nn/moe.h), modelled as
  // balanced routing (or the busiest rank at options.moe_skew x it): each rank sends K = kept x B s
  // x top-k rows and runs as many (K / ep of its own, the rest received), each buffer grown
  // to 1.25x what it first needed (the first steps' imbalance is not modelled). Kept per
  // micro-batch by every MoE block's record (recomputed into the workspace's one record under full
  // recomputation), plus the exchange scratch the stage's MoE blocks share.
  void add_routed_rows(StageSheet& s, const ModelSpec& m, const Layout& l, int moe_blocks) const {
    const double C = m.hidden, F = 4.0 * C, E = m.moe.experts, ep = l.ep, grow = 1.25;
    // A cp rank's rows: the records hold ceil(block_size / cp) of each sequence, a pass s / cp.
    const double BT = static_cast<double>(l.micro_batch) * ((m.block_size() + l.cp - 1) / l.cp);
    const double Bs = local_tokens(m, l);
    const double kept = m.moe.capacity_factor > 0 ? std::min(1.0, m.moe.capacity_factor) : 1.0;
    // The busiest rank runs (and receives) skew x the balanced rows; it sends its own K.
    const double skew = l.ep > 1 ? options.moe_skew : 1.0;
    const double K = kept * Bs * m.moe.top_k, K_local = skew * K / ep, R = skew * (K - K / ep);
    const double rows = grow * 4 * ((K_local + R) * (C + 2 * F) + K * C);
    if (l.recompute == nn::Recompute::Full)
      s.workspace_bytes += rows;
    else
      s.record_bytes += moe_blocks * rows;
    s.workspace_bytes += grow * 4 * (2 * K * C + 2 * R * C + (K_local + R) * F) + grow * 4 * BT * E;
  }

  mutable GemmEfficiencyCache gemm_;  // options.gemm_efficiency's lookups
  mutable ModelSpec measured_model_;
  mutable std::map<std::tuple<int, int, bool, bool, int, bool, int, int, int, int, int>,
                   StageMeasure>
      measures_;

  struct BucketPeaks {
    double peak = 0;     // the most bytes of this chunk's buckets alive at once
    double pending = 0;  // what its last backward leaves in flight
  };
  // ZeRO-2/3 buckets of one chunk (data_parallel.cc), in backward order 0..n-1 (the head's side
  // first). A backward gives the bucket it reaches a gradient buffer and launches its reduction
  // when done; after each launch the engine keeps at most two reductions in flight, completing the
  // older ones, so at bucket k the buffers of k, k-1 and k-2 exist, and at bucket 0 of a later
  // micro-batch those the previous backward left (n-1, n-2): an engine completes reductions only
  // in its own hooks. ZeRO-3 also holds the bucket's gathered parameters and the prefetched next
  // bucket's, forward and backward. The embedding's bucket, read by the tied head, keeps its
  // gradient buffer from the head's backward to its own, and its parameters gathered throughout.
  // Under bf16 a pending reduction holds only its bf16 wire, and a prefetched bucket its bf16
  // gather buffer (widened into the fp32 working copy when acquired). A context-parallel
  // attention's buffers (s.cp_transient) exist during the forward and backward of a bucket whose
  // units run an attention core, on top of that bucket's state then (a later micro-batch's forward
  // runs with the last backward's reductions pending).
  BucketPeaks zero_transient(const StageSheet& s, const ModelSpec& m, const Layout& l,
                             int micro_batches) const {
    if (!parallel::traits(l.zero).shards_gradients || l.dp < 1)
      return {std::max(s.cp_transient.fwd, s.cp_transient.bwd), 0};
    // Buckets in backward order (parallel/buckets.cc): whole units, grown until >= the target.
    const double target = std::floor(options.bucket_mb * 1024 * 1024 / 4);
    std::vector<double> size;
    std::vector<int> bucket_of(s.unit_elems.size(), -1);
    int hi = static_cast<int>(s.unit_elems.size()) - 1;
    while (hi >= 0) {
      int lo = hi;
      double sz = s.unit_elems[static_cast<size_t>(hi)];
      while (lo > 0 && sz < target) sz += s.unit_elems[static_cast<size_t>(--lo)];
      for (int u = lo; u <= hi; ++u)
        bucket_of[static_cast<size_t>(u)] = static_cast<int>(size.size());
      size.push_back(sz);
      hi = lo - 1;
    }
    const int n = static_cast<int>(size.size());
    std::vector<bool> has_core(static_cast<size_t>(n), false);  // a bucket's units run a core
    for (size_t i = 0; i < bucket_of.size(); ++i) {
      const int u = s.units.first + static_cast<int>(i);
      if (u >= 1 && u <= m.layers && part_of(s.units, u) != nn::BlockPart::Mlp)
        has_core[static_cast<size_t>(bucket_of[i])] = true;
    }
    auto core = [&](int b, double bytes) { return has_core[static_cast<size_t>(b)] ? bytes : 0.0; };
    auto bytes = [&](int b) { return 4 * size[static_cast<size_t>(b)]; };
    auto pending = [&](int b) { return options.grad_comm_bytes * size[static_cast<size_t>(b)]; };
    auto prefetched = [&](int b) {
      return options.param_gather_bytes * size[static_cast<size_t>(b)];
    };
    const int emb = s.has_embedding && s.has_head && bucket_of.front() != bucket_of.back()
                        ? bucket_of.front()
                        : -1;
    const double leftover = pending(n - 1) + (n >= 2 ? pending(n - 2) : 0);
    const bool later_micro_batches = micro_batches > 1;
    // Bucket `in_use` (and the embedding's) gathered in fp32, `next` prefetched.
    auto gathered = [&](int in_use, int next) {
      std::set<int> full{in_use};
      if (emb >= 0) full.insert(emb);
      double params = 0;
      for (int b : full) params += bytes(b);
      return full.count(next) ? params : params + prefetched(next);
    };
    double peak = 0;
    for (int k = 0; k < n; ++k) {
      double grads = bytes(k);
      if (k >= 1) grads += pending(k - 1);
      if (k >= 2) grads += pending(k - 2);
      if (k == 0 && later_micro_batches) grads += leftover;
      if (emb >= 0 && k != emb) grads += bytes(emb);
      const double params =
          parallel::traits(l.zero).shards_parameters ? gathered(k, std::min(k + 1, n - 1)) : 0;
      peak = std::max(peak, grads + params + core(k, s.cp_transient.bwd));
    }
    // A forward: bucket j gathered, j - 1 prefetched (ZeRO-3), the last backward's left.
    for (int j = n - 1; j >= 0; --j) {
      const double params =
          parallel::traits(l.zero).shards_parameters ? gathered(j, std::max(j - 1, 0)) : 0;
      peak = std::max(peak,
                      (later_micro_batches ? leftover : 0) + params + core(j, s.cp_transient.fwd));
    }
    return {peak, leftover};
  }
};

}  // namespace

std::unique_ptr<Engine> make_tessera_engine() {
  return std::make_unique<TesseraEngine>();
}

}  // namespace tessera::plan
