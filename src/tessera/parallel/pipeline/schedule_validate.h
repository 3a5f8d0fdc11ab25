// Structural checks of a schedule (docs/ARCHITECTURE.md, decision 18), independent of timing: what
// any executor needs from the lists before it runs them. check_deadlock (schedule_deadlock.h) then
// checks that the lists, run with asynchronous sends and blocking receives, reach the end.
#pragma once

#include <string>
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::parallel {

// Every problem found, as a sentence naming the rank and action; empty for a valid schedule:
// - one action list per pipeline rank; micro-batches in [0, micro_batches), chunks in [0, v);
// - on every rank, for every chunk and micro-batch: F exactly once, then either B exactly once or
//   BI and later W exactly once each (never both forms), B / BI after F, W after BI;
// - a RecvForward before the F of every stage but the first and a SendForward after it on every
//   stage but the last; a RecvBackward before the B / BI of every stage but the last and a
//   SendBackward after it on every stage but the first; no other transfers;
// - a chunk's SendBackward of micro-batch m before the chunk's next backward (B or BI of another
//   micro-batch), which may overwrite m's input gradient;
// - every send has a matching receive (same direction and micro-batch) on the rank that holds
//   the stage it is meant for, and every receive a matching send;
// - between two ranks, in each direction, receives are in the order of the sends (so an
//   executor may use ordered point-to-point messages without tags);
// - ReduceGradients once, after the rank's last compute action, and OptimizerStep last.
std::vector<std::string> validate_schedule(const Schedule& s);

// Throws ConfigError listing the problems validate_schedule finds (the first few of them).
void check_schedule(const Schedule& s);

}  // namespace tessera::parallel
