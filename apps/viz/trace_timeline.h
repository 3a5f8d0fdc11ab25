// Reads the Chrome trace-event JSON that `tessera train --trace` writes (core/trace.h: one
// process per rank, thread 0 "compute" and thread 1 "comm", complete events with name, cat, ts
// and dur in microseconds) back into a Timeline to draw. Compute events become boxes coloured by
// category (parallel::trace_category's names), comm events the thin strip, and the "idle" spans
// the trainer adds are left out, so the gaps show.
#pragma once

#include <limits>
#include <string>

#include "viz/timeline.h"

namespace tessera::viz {

// A part of the trace to draw: [from_ms, to_ms] after the earliest event.
struct TraceWindow {
  double from_ms = 0;
  double to_ms = std::numeric_limits<double>::infinity();
};

// `json_text` is the file's content; `source` names it in errors and the title. Times are in
// milliseconds from the earliest event; spans are cut to `window`, and the bubble in the title
// is measured inside it. Throws IoError for text that is not such a trace.
Timeline timeline_from_chrome_trace(const std::string& json_text, const std::string& source,
                                    const TraceWindow& window = {});

// Reads and parses the file at `path` (IoError if it cannot be read).
Timeline read_trace_timeline(const std::string& path, const TraceWindow& window = {});

}  // namespace tessera::viz
