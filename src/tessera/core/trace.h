// Timeline recording for Chrome's trace-event format (opens in Perfetto or chrome://tracing).
// Each rank records into its own Tracer; a span is a named interval on one of the rank's tracks
// ("compute", "comm"). Recording is off unless a Tracer is installed for the thread, and then
// costs two clock reads and one vector append per span.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tessera {

using TraceClock = std::chrono::steady_clock;

struct TraceEvent {
  std::string name;
  std::string category;  // "forward", "backward", "comm", "optimizer", "idle", ...
  int track = 0;         // 0: compute, 1: comm
  int64_t start_us = 0;  // since the tracer's origin
  int64_t dur_us = 0;
};

class Tracer {
 public:
  // All tracers of one job share `origin` so their tracks line up.
  Tracer(int rank, TraceClock::time_point origin) : rank_(rank), origin_(origin) {}
  int rank() const { return rank_; }
  void record(std::string name, std::string category, int track, TraceClock::time_point start,
              TraceClock::time_point end);
  std::vector<TraceEvent> events() const;
  int64_t to_us(TraceClock::time_point t) const;

  // The tracer of this thread (null: tracing off). Set with TracerScope.
  static Tracer* current();

 private:
  friend class TracerScope;
  int rank_;
  TraceClock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
};

class TracerScope {
 public:
  explicit TracerScope(Tracer* t);
  ~TracerScope();
  TracerScope(const TracerScope&) = delete;
  TracerScope& operator=(const TracerScope&) = delete;

 private:
  Tracer* previous_;
};

// Records [construction, destruction) on the current tracer, if any.
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category, int track = 0)
      : tracer_(Tracer::current()), name_(name), category_(category), track_(track) {
    if (tracer_) start_ = TraceClock::now();
  }
  TraceSpan(std::string name, const char* category, int track = 0)
      : tracer_(Tracer::current()), name_(std::move(name)), category_(category), track_(track) {
    if (tracer_) start_ = TraceClock::now();
  }
  ~TraceSpan() {
    if (tracer_) tracer_->record(std::move(name_), category_, track_, start_, TraceClock::now());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* tracer_;
  std::string name_;
  const char* category_;
  int track_;
  TraceClock::time_point start_;
};

// Adds "idle" spans for the gaps between consecutive compute-track events of each rank that lie
// inside [first event, last event] (gaps shorter than min_gap_us are ignored).
std::vector<TraceEvent> with_idle_spans(std::vector<TraceEvent> events, int64_t min_gap_us = 20);

// The Chrome trace-event JSON of several ranks' events: one process per rank ("rank r"), with
// threads "compute" and "comm".
std::string chrome_trace_json(const std::vector<std::pair<int, std::vector<TraceEvent>>>& ranks);

}  // namespace tessera
