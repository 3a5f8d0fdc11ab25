// Test helpers (gloo's spawnThreads style): run a lambda on N thread-ranks and collect what each
// rank threw; shared correctness checks that work on any backend.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/comm/launch.h"

namespace tessera::comm::test {

// Runs fn on n thread-ranks; rethrows the first exception (in time) after all threads end.
inline void spawn(int n, const std::function<void(Communicator&)>& fn, CommOptions opts = {}) {
  if (opts.timeout == kDefaultTimeout) opts.timeout = std::chrono::seconds(20);
  run_inproc(n, fn, opts);
}

// Runs fn on n thread-ranks and returns what each rank threw (null when it returned).
inline std::vector<std::exception_ptr> spawn_collect(int n,
                                                     const std::function<void(Communicator&)>& fn,
                                                     CommOptions opts = {}) {
  if (opts.timeout == kDefaultTimeout) opts.timeout = std::chrono::seconds(2);
  return run_inproc_each(n, fn, opts);
}

// The message of an exception_ptr, and whether it holds an E.
inline std::string what(const std::exception_ptr& e) {
  if (!e) return "(no error)";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "?";
}
template <typename E>
bool holds(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

inline double since_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Whole-suite correctness checks over one communicator; throw std::runtime_error on a wrong value.
// `count` is the element count of the per-rank block (or buffer, for all_reduce / broadcast).
// `full` runs every dtype x op x in-place x algorithm combination; otherwise a reduced set (used
// for large counts).
void check_all_reduce(Communicator& c, size_t count, bool full);
void check_all_gather(Communicator& c, size_t count, bool full);
void check_reduce_scatter(Communicator& c, size_t count, bool full);
void check_broadcast(Communicator& c, size_t count, bool full);
void check_all_to_all(Communicator& c, size_t count, bool full);
void check_all_to_allv(Communicator& c, size_t count);
// all_to_allv with all-zero counts (null buffers), everything sent to one rank, and random counts;
// exchange_counts gives each pattern's receive counts.
void check_all_to_allv_patterns(Communicator& c, size_t count);
void check_send_recv(Communicator& c, size_t count);
// send_recv: a ring, pairs with unequal counts (and a rank paired with itself), a pipeline with
// skipped halves, a no-op, and messages shared with send/recv; every dtype kind.
void check_send_recv_exchange(Communicator& c, size_t count);
// Communicator::traffic(): one call of every kind (collectives, all_to_allv with counts that
// differ by pair, exchange_counts, send/recv, send_recv with both halves, a skipped send and,
// on one rank, an exchange with itself, barrier, split), each checked against the bytes its
// counter must gain on this rank; then reset_traffic(). Works on a size-1 communicator (every
// counter stays 0).
void check_traffic(Communicator& c, DType t);

}  // namespace tessera::comm::test
