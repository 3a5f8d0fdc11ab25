#include "tessera/comm/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessera/comm/errors.h"
#include "tessera/comm/fault.h"

namespace tessera::comm {

using detail::OpType;

std::string_view call_state_name(CallState s) {
  switch (s) {
    case CallState::Queued:
      return "queued";
    case CallState::Started:
      return "started";
    case CallState::Completed:
      return "completed";
    case CallState::Failed:
      return "failed";
  }
  return "?";
}

std::string_view failure_reason(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError&) {
    return "timeout";
  } catch (const InjectedExit&) {
    return "exit";
  } catch (const InjectedFaultError&) {
    return "injected_fault";
  } catch (...) {
    return "failure";
  }
}

FlightRecorder::FlightRecorder(int world_rank, int world_size, size_t capacity,
                               std::string dump_dir)
    : world_rank_(world_rank),
      world_size_(world_size),
      dir_(std::move(dump_dir)),
      anchor_steady_(std::chrono::steady_clock::now()),
      anchor_wall_(std::chrono::system_clock::now()),
      ring_(std::max<size_t>(capacity, 1)) {}

int64_t FlightRecorder::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              anchor_steady_)
      .count();
}

uint16_t FlightRecorder::add_communicator(const std::string& name, int rank, int size) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < comms_.size(); ++i)
    if (comms_[i].name == name && comms_[i].rank == rank && comms_[i].size == size)
      return static_cast<uint16_t>(i);
  if (comms_.size() >= UINT16_MAX) return UINT16_MAX - 1;  // thousands of groups: share the last
  comms_.push_back(Comm{name, rank, size});
  return static_cast<uint16_t>(comms_.size() - 1);
}

uint64_t FlightRecorder::issued(uint16_t comm, const detail::OpDesc& d, uint64_t call, bool async,
                                bool started) {
  const int64_t t = now_ns();
  std::lock_guard lk(mu_);
  const uint64_t id = next_id_++;
  CallRecord& r = ring_[id % ring_.size()];
  r.id = id;
  r.seq = detail::is_collective(d.type) ? d.seq : 0;
  r.call = call;
  r.comm = comm;
  r.op = d.type;
  r.dtype = d.dtype;
  r.reduce = d.op;
  r.state = started ? CallState::Started : CallState::Queued;
  r.async = async;
  r.root = d.type == OpType::Broadcast ? d.root : -1;
  r.peer = d.peer;
  r.recv_peer = d.recv_peer;
  r.tag = d.tag;
  r.count = d.count;
  r.recv_count = d.recv_count;
  r.bytes = (d.count + d.recv_count) * dtype_size(d.dtype);
  r.queued_ns = t;
  r.started_ns = started ? t : -1;
  r.ended_ns = -1;
  ++changes_;
  return id;
}

CallRecord* FlightRecorder::find(uint64_t id) {
  if (id == 0) return nullptr;
  CallRecord& r = ring_[id % ring_.size()];
  return r.id == id ? &r : nullptr;
}

void FlightRecorder::started(uint64_t id) {
  const int64_t t = now_ns();
  std::lock_guard lk(mu_);
  if (CallRecord* r = find(id)) {
    r->state = CallState::Started;
    r->started_ns = t;
    ++changes_;
  }
}

void FlightRecorder::ended(uint64_t id, bool ok) {
  const int64_t t = now_ns();
  std::lock_guard lk(mu_);
  if (CallRecord* r = find(id)) {
    r->state = ok ? CallState::Completed : CallState::Failed;
    if (r->started_ns < 0) r->started_ns = t;
    r->ended_ns = t;
    ++changes_;
  }
}

std::vector<CallRecord> FlightRecorder::records() const {
  std::lock_guard lk(mu_);
  std::vector<CallRecord> out;
  const uint64_t n = ring_.size();
  const uint64_t first = next_id_ > n ? next_id_ - n : 1;
  out.reserve(next_id_ - first);
  for (uint64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % n]);
  return out;
}

uint64_t FlightRecorder::issued_total() const {
  std::lock_guard lk(mu_);
  return next_id_ - 1;
}

void FlightRecorder::note_failure(std::string_view reason, std::string_view error) {
  std::lock_guard lk(dump_mu_);
  if (!first_reason_.empty()) return;
  first_reason_ = std::string(reason);
  first_error_ = std::string(error);
}

namespace {
std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}
}  // namespace

nlohmann::json FlightRecorder::to_json(std::string_view reason, std::string_view error) const {
  std::vector<CallRecord> recs;
  std::vector<Comm> comms;
  uint64_t total = 0;
  {
    std::lock_guard lk(mu_);
    comms = comms_;
    total = next_id_ - 1;
  }
  recs = records();
  using nlohmann::json;
  const auto wall_ns = [](std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  json j = {{"format", "tessera-flight-recorder"},
            {"version", kFlightRecorderVersion},
            {"world_rank", world_rank_},
            {"world_size", world_size_},
            {"host", host_name()},
            {"pid", static_cast<int64_t>(getpid())},
            {"reason", reason},
            {"error", error},
            {"anchor_wall_ns", wall_ns(anchor_wall_)},
            {"dumped_at_ns", now_ns()},
            {"capacity", ring_.size()},
            {"issued_total", total},
            {"wait_s", wait_seconds()}};
  if (!first_reason_.empty())
    j["first_failure"] = {{"reason", first_reason_}, {"error", first_error_}};
  json cj = json::array();
  for (const Comm& c : comms) cj.push_back({{"name", c.name}, {"rank", c.rank}, {"size", c.size}});
  j["communicators"] = std::move(cj);
  json rj = json::array();
  for (const CallRecord& r : recs) {
    json e = {{"id", r.id},
              {"comm", r.comm < comms.size() ? comms[r.comm].name : std::string("?")},
              {"seq", r.seq},
              {"call", r.call},
              {"op", detail::op_name(r.op)},
              {"dtype", dtype_name(r.dtype)},
              {"count", r.count},
              {"bytes", r.bytes},
              {"state", call_state_name(r.state)},
              {"async", r.async},
              {"queued_ns", r.queued_ns},
              {"started_ns", r.started_ns},
              {"ended_ns", r.ended_ns}};
    if (r.op == OpType::AllReduce || r.op == OpType::ReduceScatter)
      e["reduce"] = reduce_op_name(r.reduce);
    if (r.op == OpType::Broadcast) e["root"] = r.root;
    if (r.op == OpType::Send || r.op == OpType::Recv || r.op == OpType::SendRecv) {
      e["peer"] = r.peer;
      e["tag"] = r.tag;
    }
    if (r.op == OpType::SendRecv) {
      e["recv_peer"] = r.recv_peer;
      e["recv_count"] = r.recv_count;
    }
    rj.push_back(std::move(e));
  }
  j["records"] = std::move(rj);
  return j;
}

std::string FlightRecorder::dump(std::string_view reason, std::string_view error) {
  if (dir_.empty()) return "";
  std::lock_guard dl(dump_mu_);
  uint64_t total = 0, changes = 0;
  {
    std::lock_guard lk(mu_);
    total = next_id_ - 1;
    changes = changes_;
  }
  if (reason == last_dump_reason_ && total == last_dump_total_ && changes == last_dump_changes_)
    return "";
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir_) / detail::concat("rank-", world_rank_, ".json");
  static std::atomic<uint64_t> unique{0};
  const fs::path tmp = fs::path(dir_) / detail::concat(".rank-", world_rank_, ".json.", getpid(),
                                                       ".", unique.fetch_add(1), ".tmp");
  try {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    const std::string text = to_json(reason, error).dump(1) + "\n";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr)
      throw CommError(detail::concat("cannot create '", tmp.string(), "': ", std::strerror(errno)));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = std::fclose(f) == 0;
    if (!ok || !closed)
      throw CommError(detail::concat("cannot write '", tmp.string(), "': ", std::strerror(errno)));
    fs::rename(tmp, path);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    std::fprintf(stderr, "tessera: flight recorder of world rank %d: dump not written: %s\n",
                 world_rank_, e.what());
    return "";
  }
  last_dump_reason_ = std::string(reason);
  last_dump_total_ = total;
  last_dump_changes_ = changes;
  return path.string();
}

}  // namespace tessera::comm
