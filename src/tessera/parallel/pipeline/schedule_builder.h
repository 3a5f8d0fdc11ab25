// Internal to the schedule generators: appends one rank's actions, adding the point-to-point
// transfers its chunks' positions in the model imply, so a generator states only the order of its
// compute actions.
#pragma once

#include <string>
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::parallel::detail {

// A schedule with its shape set and one empty action list per rank. Checks pp >= 1 and
// micro_batches >= 1 (ConfigError naming the schedule).
Schedule empty_schedule(ScheduleKind kind, int pp, int micro_batches, int virtual_stages);

class RankProgram {
 public:
  RankProgram(const Schedule& s, int rank) : s_(s), rank_(rank) {}
  void forward(int micro_batch, int chunk);          // [RecvForward] F [SendForward]
  void backward(int micro_batch, int chunk);         // [RecvBackward] B [SendBackward]
  void backward_input(int micro_batch, int chunk);   // [RecvBackward] BI [SendBackward]
  void backward_weight(int micro_batch, int chunk);  // W (no transfer)
  // The list so far followed by ReduceGradients and OptimizerStep.
  std::vector<Action> finish() &&;

 private:
  void backward_kind(ActionKind kind, int micro_batch, int chunk);
  bool first_stage(int chunk) const { return s_.stage_of(rank_, chunk) == 0; }
  bool last_stage(int chunk) const {
    return s_.stage_of(rank_, chunk) == s_.num_model_stages() - 1;
  }

  const Schedule& s_;
  int rank_;
  std::vector<Action> actions_;
};

}  // namespace tessera::parallel::detail
