// Runs a schedule's action lists against each other under the communication semantics every
// executor provides: a send is posted without waiting, a receive waits until the matching send
// has been posted (and, with a latency, until it has arrived). Compute actions take the time
// `duration` gives. The simulator and the deadlock checker are both built on this.
#pragma once

#include <cstddef>
#include <functional>
#include <tuple>
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::parallel {

struct TimedAction {
  Action action;
  double start = 0;  // a receive starts when the rank reaches it and ends when the data is there
  double end = 0;
};

struct Replay {
  std::vector<std::vector<TimedAction>> ranks;  // the actions each rank ran, timed
  std::vector<size_t> next;  // per rank, the index of its first action that could not run
  bool finished(const Schedule& s) const;  // every rank ran its whole list
};

// The time compute action `a` of `rank` takes.
using ActionDuration = std::function<double(int rank, const Action& a)>;

// Runs every rank as far as it can get. A rank stops only at a receive whose send is never posted.
Replay replay_schedule(const Schedule& s, const ActionDuration& duration, double p2p_latency);

// A transfer's identity: direction, micro-batch and the model stage that receives it. A send and
// a receive match when their keys are equal. `from_stage` is the stage that sends it.
struct TransferKey {
  bool backward = false;
  int micro_batch = 0;
  int to_stage = 0;
  int from_stage() const { return backward ? to_stage + 1 : to_stage - 1; }
  friend auto operator<=>(const TransferKey&, const TransferKey&) = default;
};
// The key of a SendForward/SendBackward/RecvForward/RecvBackward action on `rank`.
TransferKey transfer_key(const Schedule& s, int rank, const Action& a);

}  // namespace tessera::parallel
