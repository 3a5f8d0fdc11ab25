// The flight recorder (docs/RELIABILITY.md, "Flight recorder"): every world rank keeps its last N
// communication calls in a fixed ring, shared by all the communicators of the rank, so that after
// a hang or a failure each rank can say what it issued, when, and how far each call got. Writing
// a record costs one uncontended lock and a copy of a few integers (no allocation); the ring is
// thread-safe because asynchronous calls start and complete on the communicators' progress
// threads.
//
// dump() writes DIR/rank-<R>.json atomically (a temporary file renamed over it): the rank, host,
// pid, the reason and error text, a clock anchor (one wall-clock reading taken with one steady-
// clock reading, so that the dumps of different processes can be put on one time line) and the
// records, oldest first. The comm layer dumps when a call fails or times out and when an
// injected fault fires; `tessera train` also dumps when a rank's error surfaces and on SIGUSR2.
// `tessera doctor DIR` (flight_doctor.h) reads the dumps of every rank.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/comm/op.h"

namespace tessera::comm {

// Version of the dump format (the "format" key is "tessera-flight-recorder").
inline constexpr int kFlightRecorderVersion = 1;

enum class CallState : uint8_t { Queued, Started, Completed, Failed };
std::string_view call_state_name(CallState s);

// One call as the ring holds it. Times are steady-clock nanoseconds since the recorder's anchor
// (-1: not reached).
struct CallRecord {
  uint64_t id = 0;    // from 1, in issue order over the rank's communicators
  uint64_t seq = 0;   // collective sequence number on its communicator (0: point to point)
  uint64_t call = 0;  // the call's number on its communicator, every kind counted, from 1
  uint16_t comm = 0;  // index into the recorder's communicators
  detail::OpType op = detail::OpType::Barrier;
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  CallState state = CallState::Queued;
  bool async = false;
  int32_t root = -1, peer = -1, recv_peer = -1, tag = 0;
  uint64_t count = 0, recv_count = 0;
  uint64_t bytes = 0;  // this rank's buffer: count (plus recv_count) x the dtype's size
  int64_t queued_ns = -1, started_ns = -1, ended_ns = -1;
};

class FlightRecorder {
 public:
  // `capacity` records (at least 1); `dump_dir` "" keeps records but writes no dump.
  FlightRecorder(int world_rank, int world_size, size_t capacity, std::string dump_dir);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  size_t capacity() const { return ring_.size(); }
  const std::string& dump_dir() const { return dir_; }

  // A communicator of the rank (allocates, once per communicator): its index for records.
  uint16_t add_communicator(const std::string& name, int rank, int size);
  // A call issued (state Queued, or Started when `started`); returns its id.
  uint64_t issued(uint16_t comm, const detail::OpDesc& d, uint64_t call, bool async, bool started);
  void started(uint64_t id);
  void ended(uint64_t id, bool ok);
  // Time the rank's threads spent blocked in communication (synchronous calls, Work::wait).
  void add_wait(std::chrono::nanoseconds t) {
    wait_ns_.fetch_add(t.count(), std::memory_order_relaxed);
  }
  double wait_seconds() const { return 1e-9 * static_cast<double>(wait_ns_.load()); }

  // The records still in the ring, oldest first, and how many were ever issued.
  std::vector<CallRecord> records() const;
  uint64_t issued_total() const;

  // The dump as JSON (see the file comment; docs/RELIABILITY.md gives every key). `reason`:
  // "failure", "timeout", "injected_fault", "exit", "error", "signal" or "request".
  nlohmann::json to_json(std::string_view reason, std::string_view error) const;
  // Writes the dump to dump_dir()/rank-<R>.json atomically and returns its path; "" when there is
  // no dump_dir() or nothing changed since the last dump for the same reason. Never throws: a
  // dump that cannot be written prints one line to stderr.
  std::string dump(std::string_view reason, std::string_view error);
  // The first failure a dump reported, kept for the later dumps ("first_failure").
  void note_failure(std::string_view reason, std::string_view error);

 private:
  struct Comm {
    std::string name;
    int rank, size;
  };
  CallRecord* find(uint64_t id);  // under mu_; null when overwritten
  int64_t now_ns() const;

  const int world_rank_, world_size_;
  const std::string dir_;
  const std::chrono::steady_clock::time_point anchor_steady_;
  const std::chrono::system_clock::time_point anchor_wall_;
  mutable std::mutex mu_;
  std::vector<CallRecord> ring_;
  std::vector<Comm> comms_;
  uint64_t next_id_ = 1;
  std::atomic<int64_t> wait_ns_{0};
  std::mutex dump_mu_;  // one dump at a time; guards the fields below
  uint64_t last_dump_total_ = 0;
  uint64_t last_dump_changes_ = 0;
  std::string last_dump_reason_;
  std::string first_reason_, first_error_;
  uint64_t changes_ = 0;  // state changes, under mu_
};

// "timeout" for a TimeoutError, "exit" for an InjectedExit, "injected_fault" for an
// InjectedFaultError, else "failure".
std::string_view failure_reason(const std::exception_ptr& e);

}  // namespace tessera::comm
