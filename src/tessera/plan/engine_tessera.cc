// The tessera engine: this code base's memory, to the byte, and its work (docs/PLANNER.md).
// Parameters: every parameter 16-float aligned, every unit padded to 16 x dp floats under ZeRO
// (nn/parameters.h, parallel/data_parallel.h). Activations: the records of nn/block.h,
// nn/embedding.h, nn/head.h (fp32, 1-byte masks) sized for micro_batch x context tokens; each
// model chunk keeps the records of its most micro-batches in flight (the executor's pool never
// shrinks), a Block::Workspace and the residual gradient. Transients: ZeRO-2/3 gradient buckets
// and ZeRO-3 gathered buckets (data_parallel.cc keeps at most two reductions pending and
// prefetches one bucket), the embedding group's gradient copy, the head's statistics.
#include <algorithm>
#include <cmath>
#include <set>

#include "tessera/plan/engine.h"
#include "tessera/plan/work.h"

namespace tessera::plan {

namespace {

constexpr double kAlign = 16;  // floats (ParameterSet aligns every parameter to 64 bytes)

double align16(double n) {
  return std::ceil(n / kAlign) * kAlign;
}
double pad_to(double n, double multiple) {
  return std::ceil(n / multiple) * multiple;
}

WorkRules tessera_rules() {
  WorkRules r;
  r.act_bytes = 4;
  r.score_bytes = 4;
  r.logit_bytes = 4;
  r.causal_blocks = true;
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
    n.gather = options.param_gather_bytes;
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
    const double t = l.tp, C = m.hidden, Cl = C / t, Fl = 4 * C / t;
    const double F = 4 * C;  // an expert's hidden width (experts are not split over tp: nn/moe.h)
    const double V0 = static_cast<double>(std::min<int64_t>(m.vocab, vocab_local(m.vocab, l.tp)));
    const double unit_align = kAlign * (parallel::traits(l.zero).sharded() ? l.dp : 1);
    const double Tb = m.block_size(), B = l.micro_batch, BT = B * Tb;
    const double hl = m.heads / t;
    const bool drop = m.dropout > 0;

    // Parameters, unit by unit; the bf16 copies of the GEMM weights (32-element aligned).
    const bool copies = options.bf16_weight_copies && !parallel::traits(l.zero).shards_parameters;
    auto copy = [&](double elems) {
      if (copies) s.bf16_copy_bytes += 2 * pad_to(elems, 32);
    };
    for (int u = units.first; u <= units.last; ++u) {
      double n = 0;
      double experts = 0;
      if (u == 0) {
        n = align16(V0 * C) + align16(Tb * C);
      } else if (u <= L) {
        ++s.blocks;
        const nn::BlockPart part = part_of(units, u);
        if (part != nn::BlockPart::Mlp) s.sequence_partial_elems += 2 * C;        // ln_1
        if (part != nn::BlockPart::Attention) s.sequence_partial_elems += 2 * C;  // ln_2
        if (part != nn::BlockPart::Mlp) {  // ln_1, c_attn, attn.c_proj
          n +=
              2 * align16(C) + align16(C * 3 * Cl) + align16(3 * Cl) + align16(Cl * C) + align16(C);
          copy(C * 3 * Cl), copy(Cl * C);
        }
        if (part == nn::BlockPart::Attention) {
          // no MLP
        } else if (m.moe.is_moe_layer(u - 1)) {  // ln_2, the router; the experts
          n += 2 * align16(C) + align16(C * m.moe.experts);
          experts =
              (m.moe.experts / l.ep) * (align16(C * F) + align16(F) + align16(F * C) + align16(C));
          for (int e = 0; e < m.moe.experts / l.ep; ++e) copy(C * F), copy(F * C);
        } else {  // ln_2, c_fc, mlp.c_proj
          n += 2 * align16(C) + align16(C * Fl) + align16(Fl) + align16(Fl * C) + align16(C);
          copy(C * Fl), copy(Fl * C);
        }
      } else {
        if (!s.has_embedding) n += align16(V0 * C);  // the last stage's own wte copy
        n += 2 * align16(C);
        copy(V0 * C);                       // the head reads wte
        s.sequence_partial_elems += 2 * C;  // ln_f
      }
      const double padded = pad_to(n + experts, unit_align);
      s.unit_elems.push_back(padded);
      s.expert_elems += experts;
      s.dense_elems += padded - experts;
    }
    if (l.pp > 1 && (s.has_embedding != s.has_head)) s.tied_wte_elems = V0 * C;

    // One record (nn::GPT::make_record): the stage input, then per unit. Under sequence
    // parallelism (provisional until --sp merges: Korthikanti et al.'s split) the tensors every
    // tensor-parallel rank holds whole (the residual stream, the LayerNorms, the masks) are split
    // over the sequence.
    const double rep = l.sp ? 1.0 / t : 1.0;
    double rec = 4 * BT * C * rep;  // hidden[0]: x0 or the stage input
    if (s.has_embedding) rec += 4 * BT + (drop ? BT * C * rep : 0);  // tokens, drop.mask
    // The attention half: ln_1 (+ mean, rstd), qkv, atty, its mask; the MLP half: ln_2 (+ mean,
    // rstd), fc, gelu(fc), its mask; a whole block also x_attn (a half's input or output). The
    // GEMM-only inputs (ln_1, atty, ln_2, gelu(fc)) take g bytes each: 2 where a bf16 model keeps
    // them in bf16 (nn/block.h; not an MoE block's ln_2, not the recomputation scratch).
    auto rest_attn_of = [&](double g) {
      return BT * (g * C * rep + 8 * rep + 12 * Cl + g * Cl) + (drop ? BT * C * rep : 0);
    };
    auto rest_mlp_of = [&](double g) {
      return BT * (g * C * rep + 8 * rep + 4 * Fl + g * Fl) + (drop ? BT * C * rep : 0);
    };
    const double g = options.bf16_gemm_inputs ? 2 : 4;
    const double rest = rest_attn_of(4) + rest_mlp_of(4) + 4 * BT * C * rep;  // all fp32
    const double att = 4 * B * hl * Tb * Tb * (drop ? 2 : 1);  // probabilities (+ dropped)
    const double Bs = B * m.seq;  // the deferred tensors are sized for the actual micro-batch
    // A mixture-of-experts MLP (nn/moe.h) instead of fc and gelu(fc): ln_2 in fp32 for every token
    // (gathered under sp), the router's logits and probabilities [BT, E] and lse, and the routed
    // rows, modelled as balanced routing: each rank sends K = kept x Bs x top-k rows and runs as
    // many (K / ep of its own, the rest received), each buffer grown to 1.25x what it first needed
    // (the first steps' imbalance is not modelled). The experts are not split over tp.
    const double E = m.moe.experts, ep = l.ep, grow = 1.25;
    const double kept = m.moe.capacity_factor > 0 ? std::min(1.0, m.moe.capacity_factor) : 1.0;
    const double K = kept * Bs * m.moe.top_k, K_local = K / ep, R = K - K_local;
    const double moe_mlp_record = BT * (4 * C + 8 * rep) + (drop ? BT * C * rep : 0) +
                                  4 * BT * (2 * E + 1) +
                                  grow * 4 * ((K_local + R) * (C + 2 * F) + K * C);
    bool any_moe = false, all_moe = true;
    for (int u = std::max(units.first, 1); u <= std::min(units.last, L); ++u) {
      const nn::BlockPart part = part_of(units, u);
      const bool attn = part != nn::BlockPart::Mlp, mlp = part != nn::BlockPart::Attention;
      const bool moe = mlp && m.moe.is_moe_layer(u - 1);
      if (moe) any_moe = true;
      if (mlp && !moe) all_moe = false;
      rec += 4 * BT * C * rep;  // the block's (half's) output
      if (l.recompute != nn::Recompute::Full)
        rec += (attn ? rest_attn_of(g) : 0) + (mlp ? (moe ? moe_mlp_record : rest_mlp_of(g)) : 0) +
               (part == nn::BlockPart::Whole ? 4 * BT * C * rep : 0);
      if (l.recompute == nn::Recompute::None && attn) rec += att;
      s.deferred_bytes += 4 * Bs * ((mlp ? C + Fl : 0) + (attn ? C + 3 * Cl : 0));
      if (l.recompute == nn::Recompute::Full)
        s.deferred_bytes += 4 * Bs * ((attn ? C + Cl : 0) + (mlp ? C + Fl : 0));
    }
    if (s.has_head)
      rec += 4 * BT * ((C + 2) * rep + V0 + 2) + 4 * BT;  // ln_f (+ stats), logits, lse, ...
    s.record_bytes = rec;
    if (!parallel::traits(l.schedule_kind()).splits_backward) s.deferred_bytes = 0;

    // Scratch: the Block::Workspace (or the head's gradient scratch) and the residual gradient.
    if (s.blocks > 0) {
      double ws = 4 * BT * (C + C + Cl + 3 * Cl + Fl) + 4 * Tb * Tb;
      if (l.recompute == nn::Recompute::Selective) ws += att + 4 * BT * Cl;
      if (l.recompute == nn::Recompute::Full) {  // one recomputed record (dense and/or MoE MLP)
        ws += rest + att;
        if (any_moe) ws += moe_mlp_record - (all_moe ? rest_mlp_of(4) : 0);
      }
      if (any_moe)  // the MoE layers' shared exchange scratch (MixtureOfExperts::Workspace)
        ws += grow * 4 * (2 * K * C + 2 * R * C + (K_local + R) * F) + grow * 4 * BT * E;
      s.workspace_bytes = ws;
    } else if (s.has_head) {
      s.workspace_bytes = 4 * BT * C;
    }
    s.workspace_bytes += 4 * BT * C;  // d_residual

    // Work.
    add_unit_work(s, m, l, tessera_rules());
    s.tp_bytes = options.activation_comm_bytes * B * m.seq * C;
    s.boundary_bytes = options.activation_comm_bytes * B * m.seq * C;
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
      zero[c] = zero_transient(chunks[c], l, micro_batches);
    double pending = 0;
    for (const BucketPeaks& z : zero) pending += z.pending;
    bool receives_gradients = false, sends_gradients = false;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const StageSheet& s = chunks[c];
      add_model_states(total, s, l, n);
      total.activations += s.workspace_bytes + chunk_peaks[c] * (s.record_bytes + s.deferred_bytes);
      // This chunk's buckets at their peak, the other chunks' reductions still pending.
      transient = std::max(transient, zero[c].peak + pending - zero[c].pending);
      transient = std::max(transient, 4 * s.tied_wte_elems);  // embedding-group gradient copy
      if (s.has_head && l.tp > 1) transient = std::max(transient, 8.0 * l.micro_batch * m.seq);
      if (!s.has_head) receives_gradients = true;
      if (!s.has_embedding) sends_gradients = true;
    }
    if (l.pp > 1) {  // step_executor.cc's buffers
      const double a = options.activation_comm_bytes, elems = chunks.front().boundary_bytes / a;
      if (a == 4)  // the fp32 output-gradient receive buffer, the input-gradient send buffer
        total.activations += 4 * elems * ((receives_gradients ? 1 : 0) + (sends_gradients ? 1 : 0));
      else  // the fp32 output-gradient buffer; one bf16 receive and one bf16 send buffer
        total.activations += (receives_gradients ? 4 * elems : 0) + 2 * a * elems;
    }
    total.buffers = transient;
    // A bf16 tensor-parallel collective's wire (nn/wire.h: [B*T, C] rounded to bf16) exists while
    // the collective runs, on top of whatever else is alive then.
    if (l.tp > 1 && options.activation_comm_bytes < 4)
      total.buffers += options.activation_comm_bytes * l.micro_batch * m.seq * m.hidden;
    return total;
  }

 private:
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
  // gather buffer (widened into the fp32 working copy when acquired).
  BucketPeaks zero_transient(const StageSheet& s, const Layout& l, int micro_batches) const {
    if (!parallel::traits(l.zero).shards_gradients || l.dp < 1) return {};
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
      peak = std::max(peak, grads + params);
    }
    if (parallel::traits(l.zero).shards_parameters) {  // a forward: bucket j gathered, j - 1
                                                       // prefetched, the last backward's left
      for (int j = n - 1; j >= 0; --j)
        peak =
            std::max(peak, (later_micro_batches ? leftover : 0) + gathered(j, std::max(j - 1, 0)));
    }
    return {peak, leftover};
  }
};

}  // namespace

std::unique_ptr<Engine> make_tessera_engine() {
  return std::make_unique<TesseraEngine>();
}

}  // namespace tessera::plan
