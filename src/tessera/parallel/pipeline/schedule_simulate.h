// Simulated timing of a schedule with given action costs: when every action starts and ends on
// every rank, how much of the step each rank is idle (the bubble), and how many micro-batches'
// activations each stage holds at its peak.
//
// Accounting. The step runs from 0 until the last rank finishes (the makespan). A rank's bubble
// is the time in the step it does not compute (waiting at receives, and idle after its own last
// action): bubble fraction = (makespan - busy) / makespan; overall = the sum over ranks of idle
// time / (ranks * makespan). With equal stages and no transfer latency this is
// (p - 1) / (m + p - 1) for GPipe and 1F1B, (p - 1) / (v*m + p - 1) for interleaved 1F1B, i.e.
// idle / (idle + compute); papers often quote idle / compute instead, (p - 1) / m and
// (p - 1) / (v*m) (docs/ARCHITECTURE.md, "Pipeline schedules as data"), which is the same bubble
// measured against the ideal step.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/parallel/pipeline/schedule_deadlock.h"
#include "tessera/parallel/pipeline/schedule_replay.h"

namespace tessera::parallel {

// The time of one micro-batch through all of one rank's layers. With v chunks per rank an action
// on one chunk takes 1/v of it, so schedules with and without interleaving compare at equal work.
struct ActionCosts {
  double forward = 1;    // F
  double backward = 2;   // B, the whole backward; a split one is BI (backward - weight) + W
  double weight = 1;     // W
  double p2p = 0;        // from a send being posted to the earliest end of its receive
  double reduce = 0;     // ReduceGradients
  double optimizer = 0;  // OptimizerStep
};

// "F,B,W" (e.g. "1,2,1"): forward, backward and weight-gradient costs. ConfigError otherwise.
ActionCosts parse_costs(const std::string& text);
// One "F,B,W" for every rank, or one per rank separated by '/' ("1,2,1/1.2,2.4,1.1"): stages of
// unequal cost, e.g. as measured on a run's timeline. ConfigError otherwise.
std::vector<ActionCosts> parse_rank_costs(const std::string& text);

// ConfigError unless the costs are usable for `s`: forward and backward > 0, the rest >= 0, and
// weight < backward when the schedule splits backwards into BI + W.
void check_costs(const ActionCosts& c, const Schedule& s);

// The time `a` occupies its rank (0 for sends and receives: a receive only waits).
double action_cost(const Schedule& s, const ActionCosts& c, const Action& a);

struct Simulation {
  std::vector<std::vector<TimedAction>> ranks;  // every action that ran, timed
  DeadlockReport deadlock;  // when deadlocked, `ranks` holds what ran before every rank stopped
  double makespan = 0;
  std::vector<double> busy;    // per rank: time spent in compute actions (and reduce / step)
  std::vector<double> bubble;  // per rank: (makespan - busy) / makespan
  double bubble_overall = 0;   // sum of idle time / (ranks * makespan)
  // Per model stage: the most micro-batches whose F has run and whose B (or W) has not yet.
  std::vector<int> peak_in_flight;
  // Per rank: the most activations it holds at once, in micro-batches through all of its layers
  // (a chunk's micro-batch counts 1/v); equal to its stage's peak without interleaving.
  std::vector<double> peak_rank_activations;
};

// Checks the costs (check_costs), then replays the schedule. Does not validate the schedule:
// call validate_schedule first for a precise account of a malformed one.
Simulation simulate(const Schedule& s, const ActionCosts& costs = {});
// The same with costs per pipeline rank (one entry per rank, or one for all; ConfigError
// otherwise): rank r's actions take per_rank[r]'s times. p2p latency is per_rank[0]'s.
Simulation simulate(const Schedule& s, const std::vector<ActionCosts>& per_rank);

// The same with a cost per model stage: stage_costs[c * pp + r] are the times of one micro-batch
// through chunk c of rank r itself (not divided by v), so stages may differ (the embedding on the
// first, the head on the last); reduce and optimizer come from each rank's chunk 0. Transfers take
// `p2p`. One entry per model stage, each checked as check_costs does.
Simulation simulate(const Schedule& s, const std::vector<ActionCosts>& stage_costs, double p2p);

// From the order of each rank's actions alone (costs do not change it): per model stage, the most
// micro-batches whose F has run and whose B (or W) has not; per rank, the most activations it
// holds at once in micro-batches through all of its layers (a chunk's counting 1/v).
struct InFlight {
  std::vector<int> peak_in_flight;
  std::vector<double> peak_rank_activations;
};
InFlight count_in_flight(const Schedule& s);

// The bubble fraction the literature's formula gives for `s` under `costs`, where it holds exactly
// (no transfer latency, no reduce / step cost), else nullopt:
//   gpipe, 1f1b:  (p - 1) / (m + p - 1)               any F, B
//   interleaved:  (p - 1) / (v m + p - 1)             any F, B
//   zb-h1:        I / (m (F + B) + I) with I = (p - 1)(F + BI - W), BI = B - W
//                 (Qi et al. 2024, table 2), when m >= p and W <= min(F, BI)
std::optional<double> closed_form_bubble(const Schedule& s, const ActionCosts& costs);

}  // namespace tessera::parallel
