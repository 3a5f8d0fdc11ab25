#include "tessera/parallel/pipeline/schedule.h"

#include <string>

#include "tessera/core/error.h"

namespace tessera::parallel {

const ScheduleTraits& traits(ScheduleKind k) {
  static const ScheduleTraits kTraits[] = {
      {"single", false, false, false}, {"gpipe", true, false, false},
      {"1f1b", true, false, false},    {"interleaved", true, true, false},
      {"zb-h1", true, false, true},
  };
  return kTraits[static_cast<size_t>(k)];
}

const char* to_string(ScheduleKind k) {
  return traits(k).name;
}

const std::vector<ScheduleKind>& pipeline_schedules() {
  static const std::vector<ScheduleKind> kinds = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                                  ScheduleKind::Interleaved,
                                                  ScheduleKind::ZeroBubbleH1};
  return kinds;
}

ScheduleKind parse_schedule(const std::string& name) {
  std::vector<std::string> choices;
  for (ScheduleKind k : pipeline_schedules()) {
    if (name == to_string(k)) return k;
    choices.push_back(to_string(k));
  }
  throw ConfigError(detail::concat(config_key("schedule"), " must be ",
                                   detail::join(choices, ", ", " or "), ", got '", name, "'"));
}

Schedule single_stage_schedule(int micro_batches) {
  Schedule s;
  s.kind = ScheduleKind::Single;
  s.name = to_string(s.kind);
  s.micro_batches = micro_batches;
  s.ranks.resize(1);
  for (int m = 0; m < micro_batches; ++m) {
    s.ranks[0].push_back({ActionKind::Forward, m, 0});
    s.ranks[0].push_back({ActionKind::Backward, m, 0});
  }
  s.ranks[0].push_back({ActionKind::ReduceGradients, -1, 0});
  s.ranks[0].push_back({ActionKind::OptimizerStep, -1, 0});
  return s;
}

std::string to_string(ActionKind k) {
  switch (k) {
    case ActionKind::Forward:
      return "F";
    case ActionKind::Backward:
      return "B";
    case ActionKind::BackwardInput:
      return "BI";
    case ActionKind::BackwardWeight:
      return "W";
    case ActionKind::SendForward:
      return "send F";
    case ActionKind::RecvForward:
      return "recv F";
    case ActionKind::SendBackward:
      return "send B";
    case ActionKind::RecvBackward:
      return "recv B";
    case ActionKind::ReduceGradients:
      return "reduce";
    case ActionKind::OptimizerStep:
      return "step";
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::string s = to_string(a.kind);
  if (a.micro_batch >= 0) {
    s += std::to_string(a.micro_batch);
    if (a.chunk != 0) {
      s += '.';
      s += std::to_string(a.chunk);
    }
  }
  return s;
}

bool is_compute(ActionKind k) {
  return k == ActionKind::Forward || k == ActionKind::Backward || k == ActionKind::BackwardInput ||
         k == ActionKind::BackwardWeight;
}

bool is_send(ActionKind k) {
  return k == ActionKind::SendForward || k == ActionKind::SendBackward;
}

bool is_recv(ActionKind k) {
  return k == ActionKind::RecvForward || k == ActionKind::RecvBackward;
}

std::string trace_category(ActionKind k) {
  switch (k) {
    case ActionKind::Forward:
      return "forward";
    case ActionKind::Backward:
      return "backward";
    case ActionKind::BackwardInput:
      return "backward-input";
    case ActionKind::BackwardWeight:
      return "backward-weight";
    case ActionKind::SendForward:
    case ActionKind::RecvForward:
    case ActionKind::SendBackward:
    case ActionKind::RecvBackward:
      return "comm";
    case ActionKind::ReduceGradients:
      return "reduce";
    case ActionKind::OptimizerStep:
      return "optimizer";
  }
  return "?";
}

}  // namespace tessera::parallel
