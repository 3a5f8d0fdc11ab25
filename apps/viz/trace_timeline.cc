#include "viz/trace_timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessera/core/error.h"
#include "viz/svg.h"

namespace tessera::viz {

namespace {

struct Event {
  int pid = 0, tid = 0;
  std::string name, category;
  double ts = 0, dur = 0;  // microseconds
};

std::vector<Event> parse_events(const std::string& json_text, const std::string& source,
                                std::map<int, std::string>& process_names) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(source + " is not JSON: " + e.what());
  }
  const nlohmann::json* list = nullptr;
  if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array())
    list = &doc["traceEvents"];
  else if (doc.is_array())
    list = &doc;
  TESSERA_CHECK_AS(IoError, list != nullptr, source,
                   " is not a Chrome trace: it has no \"traceEvents\" list");
  std::vector<Event> events;
  for (const nlohmann::json& e : *list) {
    if (!e.is_object()) continue;
    const std::string ph = e.value("ph", "");
    const int pid = e.contains("pid") && e["pid"].is_number_integer() ? e["pid"].get<int>() : 0;
    if (ph == "M" && e.value("name", "") == "process_name" && e.contains("args") &&
        e["args"].is_object() && e["args"].contains("name") && e["args"]["name"].is_string()) {
      process_names[pid] = e["args"]["name"].get<std::string>();
      continue;
    }
    if (ph != "X") continue;
    TESSERA_CHECK_AS(
        IoError,
        e.contains("ts") && e["ts"].is_number() && e.contains("dur") && e["dur"].is_number(),
        source, ": a complete (\"X\") event lacks a numeric ts or dur: ", e.dump());
    Event ev;
    ev.pid = pid;
    ev.tid = e.contains("tid") && e["tid"].is_number_integer() ? e["tid"].get<int>() : 0;
    ev.name = e.value("name", "");
    ev.category = e.value("cat", "");
    ev.ts = e["ts"].get<double>();
    ev.dur = e["dur"].get<double>();
    events.push_back(std::move(ev));
  }
  return events;
}

}  // namespace

Timeline timeline_from_chrome_trace(const std::string& json_text, const std::string& source,
                                    const TraceWindow& window) {
  TESSERA_CHECK_AS(ConfigError, window.from_ms < window.to_ms, "the trace window ends (",
                   window.to_ms, " ms) before it starts (", window.from_ms, " ms)");
  std::map<int, std::string> process_names;
  const std::vector<Event> events = parse_events(json_text, source, process_names);
  TESSERA_CHECK_AS(IoError, !events.empty(), source, " holds no timed (\"X\") events");
  double origin = std::numeric_limits<double>::infinity();
  for (const Event& e : events) origin = std::min(origin, e.ts);
  std::map<int, TimelineRow> rows;
  for (const Event& e : events) {
    TimelineRow& row = rows[e.pid];
    if (e.category == "idle") continue;
    TimelineBox b;
    b.start = std::max((e.ts - origin) / 1000.0, window.from_ms);
    b.end = std::min((e.ts + e.dur - origin) / 1000.0, window.to_ms);
    if (b.end < b.start || (b.end == b.start && e.dur > 0)) continue;  // outside the window
    b.kind = e.tid == 1 ? BoxKind::Comm : box_kind_of_category(e.category);
    // On a compute track a communication span (a pipeline receive) or a wait (for an expert
    // exchange) is time the rank blocks: drawn, but idle in the bubble.
    b.waits = e.tid != 1 && (e.category == "comm" || e.category == "wait");
    b.label = e.name;
    char buf[64];
    std::snprintf(buf, sizeof buf, ": %.3f ms at %.3f ms", e.dur / 1000.0, b.start);
    b.tooltip = e.name + (e.category.empty() ? "" : " [" + e.category + "]") + buf;
    (e.tid == 1 ? row.comm : row.boxes).push_back(std::move(b));
  }
  Timeline t;
  t.time_unit = "ms";
  for (auto& [pid, row] : rows) {
    auto it = process_names.find(pid);
    row.name = it != process_names.end() ? it->second : "rank " + std::to_string(pid);
    auto by_start = [](const TimelineBox& a, const TimelineBox& b) { return a.start < b.start; };
    std::sort(row.boxes.begin(), row.boxes.end(), by_start);
    std::sort(row.comm.begin(), row.comm.end(), by_start);
    t.rows.push_back(std::move(row));
  }
  const size_t slash = source.find_last_of('/');
  t.title = slash == std::string::npos ? source : source.substr(slash + 1);
  char buf[160];
  if (window.from_ms > 0 || std::isfinite(window.to_ms)) {
    std::snprintf(buf, sizeof buf, ", %s to %s ms", format_number(window.from_ms).c_str(),
                  std::isfinite(window.to_ms) ? format_number(window.to_ms).c_str() : "end");
    t.title += buf;
  }
  std::snprintf(buf, sizeof buf, ": bubble %.1f%% (idle share of the compute tracks)",
                100 * overall_bubble(t));
  t.title += buf;
  return t;
}

Timeline read_trace_timeline(const std::string& path, const TraceWindow& window) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK_AS(IoError, in.good(), "cannot read the trace ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return timeline_from_chrome_trace(text.str(), path, window);
}

}  // namespace tessera::viz
