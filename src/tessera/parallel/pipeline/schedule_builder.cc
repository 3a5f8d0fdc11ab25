#include "tessera/parallel/pipeline/schedule_builder.h"

#include "tessera/core/error.h"

namespace tessera::parallel::detail {

Schedule empty_schedule(ScheduleKind kind, int pp, int micro_batches, int virtual_stages) {
  const char* name = to_string(kind);
  TESSERA_CHECK_AS(ConfigError, pp >= 1, "the ", name,
                   " schedule needs at least 1 pipeline rank, not ", pp);
  TESSERA_CHECK_AS(ConfigError, micro_batches >= 1, "the ", name,
                   " schedule needs at least 1 micro-batch, not ", micro_batches);
  Schedule s;
  s.kind = kind;
  s.name = name;
  s.pp = pp;
  s.micro_batches = micro_batches;
  s.virtual_stages = virtual_stages;
  s.ranks.resize(static_cast<size_t>(pp));
  return s;
}

void RankProgram::forward(int micro_batch, int chunk) {
  if (!first_stage(chunk)) actions_.push_back({ActionKind::RecvForward, micro_batch, chunk});
  actions_.push_back({ActionKind::Forward, micro_batch, chunk});
  if (!last_stage(chunk)) actions_.push_back({ActionKind::SendForward, micro_batch, chunk});
}

void RankProgram::backward(int micro_batch, int chunk) {
  backward_kind(ActionKind::Backward, micro_batch, chunk);
}

void RankProgram::backward_input(int micro_batch, int chunk) {
  backward_kind(ActionKind::BackwardInput, micro_batch, chunk);
}

void RankProgram::backward_weight(int micro_batch, int chunk) {
  actions_.push_back({ActionKind::BackwardWeight, micro_batch, chunk});
}

void RankProgram::backward_kind(ActionKind kind, int micro_batch, int chunk) {
  if (!last_stage(chunk)) actions_.push_back({ActionKind::RecvBackward, micro_batch, chunk});
  actions_.push_back({kind, micro_batch, chunk});
  if (!first_stage(chunk)) actions_.push_back({ActionKind::SendBackward, micro_batch, chunk});
}

std::vector<Action> RankProgram::finish() && {
  actions_.push_back({ActionKind::ReduceGradients, -1, 0});
  actions_.push_back({ActionKind::OptimizerStep, -1, 0});
  return std::move(actions_);
}

}  // namespace tessera::parallel::detail
