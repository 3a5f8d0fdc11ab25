// Deadlock check: a schedule deadlocks when, with asynchronous sends and blocking receives, some
// ranks wait at receives whose sends are never posted (usually because the senders themselves
// wait, in a cycle). The report names every stuck rank, the action it waits at, and why the
// send it waits for does not come.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::parallel {

struct StuckRank {
  int rank = 0;
  size_t index = 0;    // position of `action` in the rank's list
  Action action;       // the receive it waits at
  int peer = -1;       // the rank that should send it (-1: no stage sends it)
  std::string reason;  // e.g. "rank 1 is itself stuck at recv F0 (action 0) before its send B0"
};

struct DeadlockReport {
  std::vector<StuckRank> stuck;  // empty when every rank runs to the end
  bool deadlocked() const { return !stuck.empty(); }
  // "no deadlock: every rank runs to the end", or "deadlock: rank 0 waits at action 2 (recv
  // B0) for rank 1, which ...; rank 1 waits at ...".
  std::string message() const;
};

DeadlockReport check_deadlock(const Schedule& s);

// The report for ranks that stopped before next[r] (as replay_schedule leaves them).
DeadlockReport deadlock_report(const Schedule& s, const std::vector<size_t>& next);

}  // namespace tessera::parallel
