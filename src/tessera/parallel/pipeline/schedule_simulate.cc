#include "tessera/parallel/pipeline/schedule_simulate.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera::parallel {

ActionCosts parse_costs(const std::string& text) {
  std::vector<double> v;
  size_t begin = 0;
  while (true) {  // every comma-separated item, empty ones included
    const size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? comma : comma - begin);
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TESSERA_CHECK_AS(ConfigError, used > 0 && used == item.size(), "costs '", text, "': '", item,
                     "' is not a number; write F,B,W such as 1,2,1");
    v.push_back(x);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  TESSERA_CHECK_AS(ConfigError, v.size() == 3, "costs '", text,
                   "' must be three numbers F,B,W (forward, whole backward, weight gradient), "
                   "such as 1,2,1");
  ActionCosts c;
  c.forward = v[0];
  c.backward = v[1];
  c.weight = v[2];
  return c;
}

std::vector<ActionCosts> parse_rank_costs(const std::string& text) {
  std::vector<ActionCosts> out;
  size_t begin = 0;
  while (true) {
    const size_t slash = text.find('/', begin);
    out.push_back(
        parse_costs(text.substr(begin, slash == std::string::npos ? slash : slash - begin)));
    if (slash == std::string::npos) break;
    begin = slash + 1;
  }
  return out;
}

namespace {
bool splits_backward(const Schedule& s) {
  for (const auto& list : s.ranks)
    for (const Action& a : list)
      if (a.kind == ActionKind::BackwardInput || a.kind == ActionKind::BackwardWeight) return true;
  return false;
}
}  // namespace

void check_costs(const ActionCosts& c, const Schedule& s) {
  TESSERA_CHECK_AS(ConfigError, c.forward > 0 && c.backward > 0,
                   "the forward and backward costs must be positive (F=", c.forward,
                   ", B=", c.backward, ")");
  TESSERA_CHECK_AS(ConfigError, c.weight >= 0 && c.p2p >= 0 && c.reduce >= 0 && c.optimizer >= 0,
                   "costs must not be negative");
  TESSERA_CHECK_AS(ConfigError, !splits_backward(s) || c.weight < c.backward, "the ", s.name,
                   " schedule splits each backward into BI and W, so the W cost (", c.weight,
                   ") must be smaller than the whole backward B (", c.backward,
                   "): BI takes B - W");
  TESSERA_CHECK_AS(ConfigError, s.virtual_stages >= 1, "the schedule has no chunks");
}

double action_cost(const Schedule& s, const ActionCosts& c, const Action& a) {
  const double per_chunk = 1.0 / s.virtual_stages;
  switch (a.kind) {
    case ActionKind::Forward:
      return c.forward * per_chunk;
    case ActionKind::Backward:
      return c.backward * per_chunk;
    case ActionKind::BackwardInput:
      return (c.backward - c.weight) * per_chunk;
    case ActionKind::BackwardWeight:
      return c.weight * per_chunk;
    case ActionKind::ReduceGradients:
      return c.reduce;
    case ActionKind::OptimizerStep:
      return c.optimizer;
    default:
      return 0;
  }
}

InFlight count_in_flight(const Schedule& s) {
  InFlight out;
  out.peak_in_flight.assign(static_cast<size_t>(s.num_model_stages()), 0);
  out.peak_rank_activations.assign(s.ranks.size(), 0.0);
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    std::vector<int> held(static_cast<size_t>(s.virtual_stages), 0);
    int total = 0, peak_total = 0;
    for (const Action& a : s.ranks[r]) {
      if (a.chunk < 0 || a.chunk >= s.virtual_stages) continue;
      int delta = 0;
      if (a.kind == ActionKind::Forward) delta = 1;
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) delta = -1;
      if (delta == 0) continue;
      int& h = held[static_cast<size_t>(a.chunk)];
      h += delta;
      total += delta;
      peak_total = std::max(peak_total, total);
      int& peak = out.peak_in_flight[static_cast<size_t>(s.stage_of(static_cast<int>(r), a.chunk))];
      peak = std::max(peak, h);
    }
    out.peak_rank_activations[r] = static_cast<double>(peak_total) / s.virtual_stages;
  }
  return out;
}

namespace {

// Makespan, busy time, bubbles and activation peaks of a replay.
Simulation summarize(const Schedule& s, Replay run) {
  Simulation sim;
  sim.deadlock = deadlock_report(s, run.next);
  sim.ranks = std::move(run.ranks);
  const size_t n = sim.ranks.size();
  sim.busy.assign(n, 0.0);
  for (size_t r = 0; r < n; ++r)
    for (const TimedAction& t : sim.ranks[r]) {
      sim.makespan = std::max(sim.makespan, t.end);
      if (!is_send(t.action.kind) && !is_recv(t.action.kind)) sim.busy[r] += t.end - t.start;
    }
  sim.bubble.assign(n, 0.0);
  double idle = 0;
  for (size_t r = 0; r < n; ++r) {
    idle += sim.makespan - sim.busy[r];
    if (sim.makespan > 0) sim.bubble[r] = (sim.makespan - sim.busy[r]) / sim.makespan;
  }
  if (sim.makespan > 0 && n > 0)
    sim.bubble_overall = idle / (static_cast<double>(n) * sim.makespan);
  InFlight f = count_in_flight(s);
  sim.peak_in_flight = std::move(f.peak_in_flight);
  sim.peak_rank_activations = std::move(f.peak_rank_activations);
  return sim;
}

}  // namespace

Simulation simulate(const Schedule& s, const ActionCosts& costs) {
  return simulate(s, std::vector<ActionCosts>{costs});
}

Simulation simulate(const Schedule& s, const std::vector<ActionCosts>& per_rank) {
  TESSERA_CHECK_AS(ConfigError, per_rank.size() == 1 || per_rank.size() == s.ranks.size(),
                   "costs: give one F,B,W for every rank or one per rank (", s.ranks.size(),
                   " ranks), not ", per_rank.size());
  for (const ActionCosts& c : per_rank) check_costs(c, s);
  auto costs_of = [&](int rank) -> const ActionCosts& {
    return per_rank[per_rank.size() == 1 ? 0 : static_cast<size_t>(rank)];
  };
  return summarize(
      s, replay_schedule(
             s, [&](int rank, const Action& a) { return action_cost(s, costs_of(rank), a); },
             per_rank.front().p2p));
}

Simulation simulate(const Schedule& s, const std::vector<ActionCosts>& stage_costs, double p2p) {
  TESSERA_CHECK_AS(ConfigError, static_cast<int>(stage_costs.size()) == s.num_model_stages(),
                   "the simulation needs one cost per model stage (", s.num_model_stages(),
                   "), got ", stage_costs.size());
  TESSERA_CHECK_AS(ConfigError, p2p >= 0, "the transfer time must not be negative");
  for (const ActionCosts& c : stage_costs) check_costs(c, s);
  // action_cost divides by v; a stage's own costs are per chunk already.
  const double v = s.virtual_stages;
  auto duration = [&](int rank, const Action& a) {
    const bool per_rank =
        a.kind == ActionKind::ReduceGradients || a.kind == ActionKind::OptimizerStep;
    const ActionCosts& c =
        stage_costs[static_cast<size_t>(s.stage_of(rank, per_rank ? 0 : a.chunk))];
    return action_cost(s, c, a) * (per_rank ? 1.0 : v);
  };
  return summarize(s, replay_schedule(s, ActionDuration(duration), p2p));
}

std::optional<double> closed_form_bubble(const Schedule& s, const ActionCosts& c) {
  if (c.p2p != 0 || c.reduce != 0 || c.optimizer != 0) return std::nullopt;
  const double p = s.pp, m = s.micro_batches, v = s.virtual_stages;
  switch (s.kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
      return (p - 1) / (m + p - 1);
    case ScheduleKind::Interleaved:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::ZeroBubbleH1: {
      const double bi = c.backward - c.weight;
      if (m < p || c.weight > c.forward || c.weight > bi) return std::nullopt;
      const double idle = (p - 1) * (c.forward + bi - c.weight);
      return idle / (m * (c.forward + c.backward) + idle);
    }
    case ScheduleKind::Single:
      break;
  }
  return std::nullopt;
}

}  // namespace tessera::parallel
