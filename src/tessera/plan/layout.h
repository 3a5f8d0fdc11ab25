// One way to lay a training job out on devices: the parallel degrees, the ZeRO stage, the
// pipeline schedule, the micro-batch and the recomputation mode. Ranks are ordered as
// Megatron-LM (and parallel/mesh.h) order them: tensor-parallel ranks adjacent, then context-
// parallel, then data-parallel, then pipeline; expert-parallel groups are runs of data-parallel
// ranks.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessera/nn/gpt_config.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/parallel/zero_stage.h"
#include "tessera/plan/model_spec.h"

namespace tessera::plan {

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int ep =
      1;  // expert-parallel ranks (a divisor of dp): each holds experts / ep of every MoE layer
  // Context parallelism (docs/ARCHITECTURE.md decision 42): every sequence split over cp ranks
  // whose attention exchanges keys and values by cp_comm; for gradients and ZeRO the cp ranks are
  // more data-parallel replicas (the gradient group is dp x cp).
  int cp = 1;
  nn::CpComm cp_comm = nn::CpComm::AllGather;
  parallel::ZeroStage zero = parallel::ZeroStage::None;
  // HSDP (parallel/mesh.h): the gradient-group ranks that share ZeRO shards, S consecutive
  // members (a host); the shards are all-reduced over the dp x cp / S replicas. 0 = all of them;
  // kShardByHost = the members one node holds (the planner resolves it on its cluster).
  static constexpr int kShardByHost = -1;
  int zero_shard = 0;
  bool sp = false;  // sequence parallelism (Korthikanti et al. 2022; needs tp > 1)
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;  // with pp > 1
  int virtual_stages = 1;  // model chunks per pipeline rank (interleaved)
  int micro_batch = 1;     // sequences per micro-batch
  nn::Recompute recompute = nn::Recompute::None;

  int devices() const { return dp * tp * pp * cp; }
  // The ranks that sum the parameters' gradients and share their ZeRO shards (dp x cp), and the
  // experts' (dp / ep x cp).
  int gradient_ranks() const { return dp * cp; }
  int expert_gradient_ranks() const { return dp / ep * cp; }
  // The ranks the parameters' ZeRO state is sharded over, and how many times it is replicated.
  int shard_ranks() const { return zero_shard > 0 ? zero_shard : gradient_ranks(); }
  int shard_replicas() const { return gradient_ranks() / shard_ranks(); }
  // Micro-batches per optimizer step on each pipeline (global batch / (dp * micro_batch)).
  int micro_batches(int global_batch) const { return global_batch / (dp * micro_batch); }
  // The schedule a run of this layout executes: Single without pipeline parallelism.
  parallel::ScheduleKind schedule_kind() const {
    return pp == 1 ? parallel::ScheduleKind::Single : schedule;
  }
  // "dp=4 tp=2 pp=2 zero=1 1f1b mb=1 recompute=none" ("cp=2 ring" after pp when cp > 1)
  std::string str() const;
  friend bool operator==(const Layout&, const Layout&) = default;
};

// Why `l` cannot train `m` with `global_batch` sequences per step, as sentences that say what to
// change (empty: it can). `uneven_stages`: whether a stage may hold no layer (tessera balances
// units by cost, so a stage may hold only the embedding or the head; the megatron engine gives
// every stage layers, equal numbers when pp * virtual stages divides them).
std::vector<std::string> layout_problems(const Layout& l, const ModelSpec& m, int global_batch,
                                         bool uneven_stages);

nlohmann::json to_json(const Layout& l);
// Keys as train's flags: dp, tp, pp, ep, cp, cp_comm, zero, zero_shard, sp, schedule,
// virtual_stages, micro_batch, recompute. Missing keys keep the defaults above. ConfigError on
// unknown keys.
Layout layout_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace tessera::plan
