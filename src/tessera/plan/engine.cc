#include "tessera/plan/engine.h"

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/plan/work.h"

namespace tessera::plan {

std::unique_ptr<Engine> make_tessera_engine();
std::unique_ptr<Engine> make_megatron_engine();

std::pair<std::string, double> MemoryTerms::largest() const {
  std::pair<std::string, double> best{"parameters", parameters};
  for (const auto& [name, v] : {std::pair<const char*, double>{"gradients", gradients},
                                {"optimizer state", optimizer_state},
                                {"activations", activations},
                                {"communication buffers", buffers},
                                {"runtime reserve", reserved}})
    if (v > best.second) best = {name, v};
  return best;
}

nlohmann::json to_json(const MemoryTerms& m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"optimizer_state", m.optimizer_state},
          {"activations", m.activations},
          {"buffers", m.buffers},
          {"reserved", m.reserved},
          {"total", m.total()}};
}

MemoryTerms zero_model_states(double elems, parallel::ZeroStage zero, int group,
                              const Numerics& n) {
  const parallel::ZeroTraits z = parallel::traits(zero);
  const double shard = elems / group;
  MemoryTerms t;
  t.parameters = n.param * (z.shards_parameters ? shard : elems);
  t.gradients = n.grad * (z.shards_gradients ? shard : elems);
  t.optimizer_state = n.optimizer * (z.shards_optimizer_state ? shard : elems);
  return t;
}

double Engine::dp_bytes_per_step(const Layout& l, const std::vector<StageSheet>& chunks,
                                 int micro_batches) const {
  const Numerics n = numerics();
  const double c = n.comm, m = micro_batches;
  double bytes = 0;
  for (const StageSheet& s : chunks) {
    // (elements, the ranks sharing their ZeRO shards, the replicas of each shard: HSDP's, dense)
    struct Set {
      double elems;
      int group, replicas;
    };
    for (const Set& set : {Set{s.dense_elems, l.shard_ranks(), l.shard_replicas()},
                           Set{s.expert_elems, l.expert_gradient_ranks(), 1}}) {
      const double elems = set.elems, group = set.group, R = set.replicas;
      if ((group <= 1 && R <= 1) || elems == 0) continue;
      // One reduce-scatter or all-gather of the elements, at `dtype_bytes` each.
      auto ring = [&](double dtype_bytes) { return (group - 1.0) / group * dtype_bytes * elems; };
      const parallel::ZeroTraits z = parallel::traits(l.zero);
      const double reductions = z.reduces_every_micro_batch ? m : 1;
      if (!z.sharded())
        bytes += 2 * ring(c);  // all-reduce once
      else
        bytes += reductions * ring(c);  // reduce-scatter into the shards
      // HSDP: the reduced shards all-reduced over their replicas, once per step.
      if (z.sharded() && R > 1) bytes += 2 * (R - 1) / R * n.replica_comm * elems / group;
      if (z.shards_parameters)
        bytes += 2 * m * ring(n.gather);  // gathers before each forward and backward
      else if (z.sharded())
        bytes += ring(n.param);  // all-gather of the parameters after the step
    }
    if (l.sp && l.tp > 1 && s.sequence_partial_elems > 0) {  // one all-reduce over dp x cp x tp
      const double g = static_cast<double>(l.gradient_ranks()) * l.tp;
      bytes += 2 * (g - 1) / g * n.grad * s.sequence_partial_elems;
    }
    if (s.tied_wte_elems > 0) {  // the embedding group: both stages' dp x cp ranks
      const double g = 2.0 * l.gradient_ranks();
      bytes += 2 * (g - 1) / g * n.grad * s.tied_wte_elems;  // the gradients as held
    }
  }
  return bytes;
}

void add_model_states(MemoryTerms& total, const StageSheet& s, const Layout& l, const Numerics& n) {
  for (const MemoryTerms& z :
       {zero_model_states(s.dense_elems, l.zero, l.shard_ranks(), n),
        zero_model_states(s.expert_elems, l.zero, l.expert_gradient_ranks(), n)}) {
    total.parameters += z.parameters;
    total.gradients += z.gradients;
    total.optimizer_state += z.optimizer_state;
  }
  total.parameters += s.bf16_copy_bytes;
}

nn::BlockPart part_of(const parallel::UnitRange& units, int u) {
  if (u == units.first && units.starts_mid_block) return nn::BlockPart::Mlp;
  if (u == units.last && units.ends_mid_block) return nn::BlockPart::Attention;
  return nn::BlockPart::Whole;
}

double StageSheet::cp_bytes(const ModelSpec& m, const Layout& l) const {
  if (l.cp <= 1) return 0;
  const CpBytes core = cp_layer_bytes(cp);
  const double routing = (l.cp - 1) * cp_routing_chunk_bytes(m, l);  // an all-gather
  return cp_cores * (core.fwd + core.bwd) + cp_core_recomputes * core.fwd +
         (cp_routers + cp_router_recomputes) * routing;
}

void add_unit_work(StageSheet& s, const ModelSpec& m, const Layout& l, const WorkRules& r,
                   double cp_elem_bytes) {
  UnitWork w;
  for (int u = s.units.first; u <= s.units.last; ++u)
    w += unit_work(m, l, u, r, part_of(s.units, u));
  s.fwd_flops = w.fwd_flops;
  s.bwd_flops = w.bwd_flops;
  s.wgrad_flops = w.wgrad_flops;
  s.recompute_flops = w.recompute_flops;
  s.gemm_costed = r.gemm != nullptr;
  s.fwd_cost = w.fwd_cost;
  s.bwd_cost = w.bwd_cost;
  s.wgrad_cost = w.wgrad_cost;
  s.recompute_cost = w.recompute_cost;
  s.fwd_bytes = w.fwd_bytes;
  s.bwd_bytes = w.bwd_bytes;
  s.recompute_bytes = w.recompute_bytes;
  s.tp_fwd = w.tp_fwd;
  s.tp_bwd = w.tp_bwd;
  s.tp_recompute = w.tp_recompute;
  s.a2a_fwd = w.a2a_fwd;
  s.a2a_bwd = w.a2a_bwd;
  s.a2a_bytes = w.a2a_bytes;
  s.core_fwd_flops = w.core_fwd_flops;
  s.core_bwd_flops = w.core_bwd_flops;
  s.core_fwd_cost = w.core_fwd_cost;
  s.core_bwd_cost = w.core_bwd_cost;
  if (l.cp > 1) {
    s.cp = cp_shape(m, l, cp_elem_bytes);
    s.cp_cores = w.attention_cores;
    s.cp_routers = w.moe_routers;
    // Both recomputations rerun the core's forward (selective: only it); a full one reruns the
    // routing too.
    s.cp_core_recomputes = l.recompute == nn::Recompute::None ? 0 : w.attention_cores;
    s.cp_router_recomputes = l.recompute == nn::Recompute::Full ? w.moe_routers : 0;
  }
}

std::unique_ptr<Engine> make_engine(const std::string& name, const EngineOptions& o) {
  std::unique_ptr<Engine> e;
  if (name == "tessera")
    e = make_tessera_engine();
  else if (name == "megatron")
    e = make_megatron_engine();
  else
    throw ConfigError(detail::concat("--engine must be tessera or megatron, got '", name, "'"));
  e->options = o;
  return e;
}

}  // namespace tessera::plan
