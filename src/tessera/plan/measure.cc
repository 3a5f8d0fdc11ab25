#include "tessera/plan/measure.h"

#include <cmath>
#include <memory>

#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"
#include "tessera/nn/gpt.h"
#include "tessera/parallel/data_parallel.h"

namespace tessera::plan {

namespace {

// The layout the trainer gives this stage (train/rank_run.cc, model_layout).
nn::GPTLayout stage_layout(const Layout& l, const parallel::UnitRange& units,
                           const EngineOptions& o) {
  nn::GPTLayout base;
  base.first_unit = units.first;
  base.last_unit = units.last;
  base.starts_mid_block = units.starts_mid_block;
  base.ends_mid_block = units.ends_mid_block;
  base.recompute = l.recompute;
  base.sequence_parallel = l.sp;
  base.cp_comm = l.cp_comm;
  if (o.bf16_gemm_inputs) {  // --precision bf16 (the emulated path: nothing is measured at start)
    base.gemm = {kernels::Precision::BF16, kernels::Bf16Gemm::Emulated};
    base.bf16_weight_copies =
        o.bf16_weight_copies ? nn::WeightCopies::Always : nn::WeightCopies::Never;
  }
  parallel::DataParallelOptions dpo;
  dpo.zero = l.zero;
  return parallel::gpt_layout_for(dpo, l.shard_ranks(), base, l.expert_gradient_ranks());
}

}  // namespace

StageMeasure measure_stage(const ModelSpec& m, const Layout& l, const parallel::UnitRange& units,
                           const EngineOptions& o, Backing backing) {
  const nn::GPTConfig cfg = to_gpt_config(m);
  // Rank 0 of the tensor-, expert- and context-parallel groups: the largest vocabulary shard. A
  // context group of cp sizes the records and workspace for a cp rank's rows.
  const std::unique_ptr<comm::Communicator> tp = comm::placeholder_group(l.tp);
  const std::unique_ptr<comm::Communicator> ep = comm::placeholder_group(l.ep);
  const std::unique_ptr<comm::Communicator> cp = comm::placeholder_group(l.cp);
  Allocator counting("plan", 0, backing);
  Layout unsharded = l;  // 16-float units and resident weights (pad_units does the rest)
  unsharded.zero = parallel::ZeroStage::None;
  nn::GPT model(cfg, l.micro_batch, counting, stage_layout(unsharded, units, o), *tp, *ep, *cp);

  StageMeasure s;
  auto span = [&](int u, nn::ParamGroup g) {
    return static_cast<double>(model.unit_begin(u + 1, g) - model.unit_begin(u, g));
  };
  for (int u = units.first; u <= units.last; ++u) {
    s.unit_dense.push_back(span(u, nn::ParamGroup::Model));
    s.unit_experts.push_back(span(u, nn::ParamGroup::Experts));
  }
  for (const nn::ParamInfo& p : model.params(nn::ParamGroup::Model).infos()) {
    if (p.reduction.over_embedding_group) s.tied_wte_elems = static_cast<double>(p.local_numel());
    if (p.reduction.over_tensor_parallel)
      s.sequence_partial_elems += static_cast<double>(p.local_numel());
  }
  for (nn::ParamGroup g : {nn::ParamGroup::Model, nn::ParamGroup::Experts})
    s.bf16_copy_bytes += static_cast<double>(model.params(g).bf16_copy_bytes());
  s.moe_blocks = static_cast<int>(model.moe_layers().size());

  s.workspace_bytes = static_cast<double>(counting.in_use(MemCategory::Activations));
  {
    const std::unique_ptr<nn::StageRecord> record = model.make_record();
    s.record_bytes =
        static_cast<double>(counting.in_use(MemCategory::Activations)) - s.workspace_bytes;
  }
  s.deferred_bytes = static_cast<double>(model.deferred_bytes(l.micro_batch, m.seq / l.cp));
  return pad_units(std::move(s), l);
}

StageMeasure pad_units(StageMeasure s, const Layout& l) {
  const parallel::ZeroTraits z = parallel::traits(l.zero);
  if (z.shards_parameters) s.bf16_copy_bytes = 0;  // ZeRO-3 keeps no resident weights to copy
  // A unit's parameters lie the same way after a start aligned to any multiple of 16 floats, so
  // ZeRO's alignment (parallel::flat_layout_for: 16 x the group's size) only moves its end. The
  // model's set is sharded over dp x cp, the experts' over dp / ep x cp.
  auto pad = [](double n, double multiple) { return std::ceil(n / multiple) * multiple; };
  const double dense_align = 16.0 * (z.sharded() ? l.shard_ranks() : 1);
  const double expert_align = 16.0 * (z.sharded() ? l.expert_gradient_ranks() : 1);
  s.unit_elems.clear();
  s.dense_elems = s.expert_elems = 0;
  for (size_t u = 0; u < s.unit_dense.size(); ++u) {
    const double dense = pad(s.unit_dense[u], dense_align);
    const double experts = pad(s.unit_experts[u], expert_align);
    s.unit_elems.push_back(dense + experts);
    s.dense_elems += dense;
    s.expert_elems += experts;
  }
  return s;
}

}  // namespace tessera::plan
