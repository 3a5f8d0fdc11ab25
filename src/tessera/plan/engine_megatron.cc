// The megatron engine: mixed-precision training as Megatron-LM runs it and the papers count it.
// Model states: 2-byte parameters and gradients and 12 bytes of fp32 optimizer state per
// parameter (master copy, momentum, variance: the ZeRO paper's K = 12). Activations: Korthikanti
// et al. 2022 per layer (korthikanti.h), the embedding's dropout mask on the first stage and the
// output layer's terms on the last; a full recomputation also needs one layer's activations while
// it recomputes. Stages hold equal numbers of layers (the embedding on the first, the head and a
// copy of the word embedding on the last); activations are sent split over the tensor-parallel
// ranks (the scatter/gather optimisation of Narayanan et al. 2021). Context parallelism: a device
// holds s / cp tokens of every sequence, so each of Korthikanti's terms is / cp, and its keys and
// values travel in bf16 (plan/context_parallel.h); the variants' transient buffers are not counted.
#include <algorithm>

#include "tessera/core/error.h"
#include "tessera/plan/engine.h"
#include "tessera/plan/korthikanti.h"
#include "tessera/plan/work.h"

namespace tessera::plan {

namespace {

WorkRules megatron_rules() {
  WorkRules r;
  r.act_bytes = 2;
  r.score_bytes = 2;
  r.logit_bytes = 4;
  r.causal_blocks = false;  // the 2021 kernels compute the full score matrix
  r.recompute_skips_last_projection = false;
  r.recompute_tp_collectives = 2;
  return r;
}

class MegatronEngine final : public Engine {
 public:
  std::string name() const override { return "megatron"; }
  Numerics numerics() const override {
    Numerics n;
    n.param = 2;
    n.grad = 2;
    n.optimizer = 12;
    n.comm = 2;
    n.replica_comm = 2;
    n.gather = 2;
    n.activation = 2;
    // Reads the 2-byte gradient and the fp32 master, momentum and variance, writes the three and
    // the 2-byte parameter.
    n.optimizer_traffic = 2 + 12 + 12 + 2;
    return n;
  }
  bool uneven_stages() const override { return false; }

  // Equal numbers of layers; when pp x v does not divide them, the later stages (which hold
  // fewer micro-batches in flight) take one more.
  std::vector<parallel::UnitRange> split(const ModelSpec& m, const Layout& l) const override {
    const int stages = l.pp * l.virtual_stages;
    TESSERA_CHECK_AS(ConfigError, stages <= m.layers, "pp x virtual stages (", stages,
                     ") must not exceed the ", m.layers, " layers");
    const int per = m.layers / stages, extra = m.layers % stages;
    std::vector<parallel::UnitRange> out;
    int next = 1;
    for (int s = 0; s < stages; ++s) {
      const int n = per + (s >= stages - extra ? 1 : 0);
      parallel::UnitRange r{next, next + n - 1};
      next += n;
      if (s == 0) r.first = 0;
      if (s == stages - 1) r.last = m.layers + 1;
      out.push_back(r);
    }
    return out;
  }

  StageSheet stage(const ModelSpec& m, const Layout& l,
                   const parallel::UnitRange& units) const override {
    StageSheet s;
    s.units = units;
    const int L = m.layers;
    s.has_embedding = units.first == 0;
    s.has_head = units.last == L + 1;
    const double t = l.tp, C = m.hidden, V = static_cast<double>(vocab_local(m.vocab, l.tp));
    LayerShape x;
    x.s = m.seq;
    x.b = l.micro_batch;
    x.h = C;
    x.a = m.heads;
    x.t = l.tp;
    x.sp = l.sp;
    x.dropout = m.dropout > 0;
    x.cp = l.cp;
    const double s_local = x.s / l.cp;  // a cp rank's tokens of each sequence

    for (int u = units.first; u <= units.last; ++u) {
      double dense = 0, experts = 0;
      if (u == 0) {
        dense = V * C + static_cast<double>(m.block_size()) * C;
      } else if (u <= L) {
        ++s.blocks;
        // Split over tp: c_attn, attn c_proj weight, c_fc, mlp c_proj weight; replicated: the
        // LayerNorms and the row-parallel biases.
        dense = (3 * C * C + 3 * C + C * C + 4 * C * C + 4 * C + 4 * C * C) / t + 6 * C;
        if (m.moe.is_moe_layer(u - 1)) {
          dense -= (8 * C * C + 4 * C) / t + C;
          dense += C * m.moe.experts;
          experts = (m.moe.experts / l.ep) * ((8 * C * C + 4 * C) / t + C);
        }
        s.record_bytes += layer_activation_bytes(x, l.recompute);
      } else {
        dense = 2 * C + (s.has_embedding ? 0 : V * C);
      }
      s.unit_elems.push_back(dense + experts);
      s.dense_elems += dense;
      s.expert_elems += experts;
    }
    if (l.pp > 1 && (s.has_embedding != s.has_head)) s.tied_wte_elems = V * C;
    if (s.has_embedding) s.record_bytes += embedding_activation_bytes(x);
    if (s.has_head) s.record_bytes += output_activation_bytes(x, m.vocab);
    // While a layer recomputes, its full activations exist once more.
    if (l.recompute == nn::Recompute::Full && s.blocks > 0)
      s.workspace_bytes = layer_activation_bytes(x, nn::Recompute::None);
    if (parallel::traits(l.schedule_kind())
            .splits_backward)  // the matmuls' output gradients wait for W
      s.deferred_bytes = s.blocks * 2 * s_local * x.b * (C + 4 * C / t + C + 3 * C / t);

    add_unit_work(s, m, l, megatron_rules(), 2);  // bf16 keys and values
    s.cp.travelling_accumulators = true;          // TransformerEngine's ring
    s.tp_bytes = 2 * s_local * x.b * C;
    s.boundary_bytes = 2 * s_local * x.b * C / t;
    return s;
  }

  MemoryTerms rank_memory(const ModelSpec&, const Layout& l, const std::vector<StageSheet>& chunks,
                          const std::vector<int>&, double rank_peak, int) const override {
    MemoryTerms total;
    const Numerics n = numerics();
    double per_micro_batch = 0, deferred = 0, workspace = 0, largest_unit = 0, params = 0;
    for (const StageSheet& s : chunks) {
      add_model_states(total, s, l, n);
      per_micro_batch += s.record_bytes;
      deferred += s.deferred_bytes;
      workspace = std::max(workspace, s.workspace_bytes);
      params += s.params();
      for (double u : s.unit_elems) largest_unit = std::max(largest_unit, u);
    }
    // Micro-batches in flight at the rank's peak (a chunk's micro-batch counting 1/v).
    total.activations = rank_peak * (per_micro_batch + deferred) + workspace;
    // Point-to-point buffers (a send and a receive), gradient buckets under ZeRO-2/3, gathered
    // layers under ZeRO-3 (the current and the prefetched one).
    if (l.pp > 1) total.buffers += 2 * chunks.front().boundary_bytes;
    const double bucket = std::min(params, options.bucket_mb * 1024 * 1024 / n.grad);
    if (parallel::traits(l.zero).shards_gradients) total.buffers += 2 * bucket * n.grad;
    if (parallel::traits(l.zero).shards_parameters) total.buffers += 2 * largest_unit * n.param;
    return total;
  }
};

}  // namespace

std::unique_ptr<Engine> make_megatron_engine() {
  return std::make_unique<MegatronEngine>();
}

}  // namespace tessera::plan
