#include "tessera/core/trace.h"

#include <algorithm>
#include <cstdio>

namespace tessera {

namespace {
thread_local Tracer* t_tracer = nullptr;

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}
}  // namespace

void Tracer::record(std::string name, std::string category, int track, TraceClock::time_point start,
                    TraceClock::time_point end) {
  TraceEvent e{std::move(name), std::move(category), track, to_us(start),
               std::chrono::duration_cast<std::chrono::microseconds>(end - start).count()};
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

std::vector<TraceEvent> Tracer::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

int64_t Tracer::to_us(TraceClock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
}

Tracer* Tracer::current() {
  return t_tracer;
}
TracerScope::TracerScope(Tracer* t) : previous_(t_tracer) {
  t_tracer = t;
}
TracerScope::~TracerScope() {
  t_tracer = previous_;
}

std::vector<TraceEvent> with_idle_spans(std::vector<TraceEvent> events, int64_t min_gap_us) {
  std::vector<TraceEvent> compute;
  for (const TraceEvent& e : events)
    if (e.track == 0) compute.push_back(e);
  std::sort(compute.begin(), compute.end(),
            [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
  int64_t covered = compute.empty() ? 0 : compute[0].start_us;
  for (const TraceEvent& e : compute) {
    if (e.start_us - covered >= min_gap_us)
      events.push_back(TraceEvent{"idle", "idle", 0, covered, e.start_us - covered});
    covered = std::max(covered, e.start_us + e.dur_us);
  }
  return events;
}

std::string chrome_trace_json(const std::vector<std::pair<int, std::vector<TraceEvent>>>& ranks) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const std::string& line) {
    if (!first) out += ",\n";
    out += line;
    first = false;
  };
  char buf[512];
  for (const auto& [rank, events] : ranks) {
    std::snprintf(
        buf, sizeof buf,
        "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", rank,
        rank);
    emit(buf);
    std::snprintf(
        buf, sizeof buf,
        "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}}",
        rank, rank);
    emit(buf);
    const char* tracks[] = {"compute", "comm"};
    for (int t = 0; t < 2; ++t) {
      std::snprintf(buf, sizeof buf,
                    "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{"
                    "\"name\":\"%s\"}}",
                    rank, t, tracks[t]);
      emit(buf);
    }
    for (const TraceEvent& e : events) {
      std::snprintf(
          buf, sizeof buf,
          "{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%lld,"
          "\"dur\":%lld}",
          json_escape(e.name).c_str(), json_escape(e.category).c_str(), rank, e.track,
          static_cast<long long>(e.start_us), static_cast<long long>(e.dur_us));
      emit(buf);
    }
  }
  out += "\n]}\n";
  return out;
}

}  // namespace tessera
