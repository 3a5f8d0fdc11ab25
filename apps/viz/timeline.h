// A timeline to draw: one row per rank, each a list of boxes (what the rank computed, from when
// to when) and a thin strip of communication. It comes from a simulated schedule
// (timeline_from_simulation) or from the Chrome trace `tessera train --trace` writes
// (trace_timeline.h), and plot_timeline.h draws it.
#pragma once

#include <string>
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/parallel/pipeline/schedule_simulate.h"

namespace tessera::viz {

enum class BoxKind { Forward, Backward, BackwardInput, BackwardWeight, Comm, Other };

struct TimelineBox {
  double start = 0;
  double end = 0;
  BoxKind kind = BoxKind::Other;
  std::string label;    // drawn inside the box when it fits (the micro-batch for a schedule)
  std::string tooltip;  // shown on hover: the full name and times
  int shade = 0;        // model chunk (interleaving): later chunks are drawn darker
  bool waits = false;   // the rank blocks here (a receive, a wait for an exchange): idle time
};

struct TimelineRow {
  std::string name;                // "rank 0"
  std::vector<TimelineBox> boxes;  // compute, in time order
  std::vector<TimelineBox> comm;   // communication, drawn as a thin strip under the boxes
};

struct Timeline {
  std::string title;
  std::string time_unit;  // axis label unit: "" (cost units) or "ms"
  int shades = 1;         // chunks per rank
  std::vector<TimelineRow> rows;
};

// Per row: the fraction of [earliest start, latest end over all rows] the row's compute boxes
// do not cover (boxes in which the rank waits do not count). Matches Simulation::bubble for a
// simulated schedule.
std::vector<double> row_bubbles(const Timeline& t);
double overall_bubble(const Timeline& t);  // the mean over rows

// The simulated schedule as a timeline: F / B / BI / W boxes labelled with the micro-batch,
// reduce and step as "other" boxes when they cost time, receives as waits are left empty (the
// gaps are the bubble). The title names the schedule, its shape, costs and bubble.
Timeline timeline_from_simulation(const parallel::Schedule& s, const parallel::Simulation& sim,
                                  const parallel::ActionCosts& costs);

// The box kind of a trace-event category ("forward", "backward", "backward-input",
// "backward-weight", "comm"; anything else is Other). Matches parallel::trace_category.
BoxKind box_kind_of_category(const std::string& category);

}  // namespace tessera::viz
