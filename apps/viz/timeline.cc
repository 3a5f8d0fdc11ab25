#include "viz/timeline.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "viz/svg.h"

namespace tessera::viz {

namespace {
// [first start, last end] over every row's compute boxes; {0, 0} when there are none.
std::pair<double, double> span(const Timeline& t) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const TimelineRow& row : t.rows)
    for (const TimelineBox& b : row.boxes) {
      lo = std::min(lo, b.start);
      hi = std::max(hi, b.end);
    }
  return lo <= hi ? std::make_pair(lo, hi) : std::make_pair(0.0, 0.0);
}

// Length of the union of the intervals of the boxes that compute (not those it waits in).
double covered(std::vector<TimelineBox> boxes) {
  std::erase_if(boxes, [](const TimelineBox& b) { return b.waits; });
  std::sort(boxes.begin(), boxes.end(),
            [](const TimelineBox& a, const TimelineBox& b) { return a.start < b.start; });
  double total = 0, reach = -std::numeric_limits<double>::infinity();
  for (const TimelineBox& b : boxes) {
    const double from = std::max(b.start, reach);
    if (b.end > from) total += b.end - from;
    reach = std::max(reach, b.end);
  }
  return total;
}
}  // namespace

std::vector<double> row_bubbles(const Timeline& t) {
  const auto [lo, hi] = span(t);
  std::vector<double> out;
  for (const TimelineRow& row : t.rows)
    out.push_back(hi > lo ? 1.0 - covered(row.boxes) / (hi - lo) : 0.0);
  return out;
}

double overall_bubble(const Timeline& t) {
  const std::vector<double> b = row_bubbles(t);
  double sum = 0;
  for (double x : b) sum += x;
  return b.empty() ? 0.0 : sum / static_cast<double>(b.size());
}

BoxKind box_kind_of_category(const std::string& category) {
  if (category == "forward") return BoxKind::Forward;
  if (category == "backward") return BoxKind::Backward;
  if (category == "backward-input") return BoxKind::BackwardInput;
  if (category == "backward-weight") return BoxKind::BackwardWeight;
  if (category == "comm") return BoxKind::Comm;
  return BoxKind::Other;
}

Timeline timeline_from_simulation(const parallel::Schedule& s, const parallel::Simulation& sim,
                                  const parallel::ActionCosts& costs) {
  using parallel::ActionKind;
  Timeline t;
  t.shades = s.virtual_stages;
  char buf[256];
  std::string shape =
      "pp=" + std::to_string(s.pp) + ", " + std::to_string(s.micro_batches) + " micro-batches";
  if (s.virtual_stages > 1) shape += ", " + std::to_string(s.virtual_stages) + " chunks per rank";
  std::string cost_text =
      "F=" + format_number(costs.forward) + " B=" + format_number(costs.backward);
  if (parallel::traits(s.kind).splits_backward)
    cost_text += " (BI=" + format_number(costs.backward - costs.weight) +
                 " W=" + format_number(costs.weight) + ")";
  if (costs.p2p > 0) cost_text += " p2p=" + format_number(costs.p2p);
  std::snprintf(buf, sizeof buf, "%s, %s, costs %s: bubble %.1f%%%s", s.name.c_str(), shape.c_str(),
                cost_text.c_str(), 100 * sim.bubble_overall,
                sim.deadlock.deadlocked() ? " (DEADLOCK: stops early)" : "");
  t.title = buf;
  for (size_t r = 0; r < sim.ranks.size(); ++r) {
    TimelineRow row;
    row.name = "rank " + std::to_string(r);
    for (const parallel::TimedAction& ta : sim.ranks[r]) {
      const parallel::Action& a = ta.action;
      if (parallel::is_send(a.kind) || parallel::is_recv(a.kind) || ta.end <= ta.start) continue;
      TimelineBox b;
      b.start = ta.start;
      b.end = ta.end;
      b.shade = a.chunk;
      switch (a.kind) {
        case ActionKind::Forward:
          b.kind = BoxKind::Forward;
          break;
        case ActionKind::Backward:
          b.kind = BoxKind::Backward;
          break;
        case ActionKind::BackwardInput:
          b.kind = BoxKind::BackwardInput;
          break;
        case ActionKind::BackwardWeight:
          b.kind = BoxKind::BackwardWeight;
          break;
        default:
          b.kind = BoxKind::Other;
      }
      b.label = a.micro_batch >= 0 ? std::to_string(a.micro_batch) : parallel::to_string(a);
      b.tooltip = parallel::to_string(a) + " (stage " +
                  std::to_string(s.stage_of(static_cast<int>(r), a.chunk)) +
                  "): " + format_number(ta.start) + " to " + format_number(ta.end);
      row.boxes.push_back(std::move(b));
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

}  // namespace tessera::viz
