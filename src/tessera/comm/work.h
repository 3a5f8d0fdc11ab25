// Work: the handle every communication call returns (c10d style). A synchronous call returns a
// completed Work; an asynchronous one (OpOptions::async) completes on the communicator's progress
// thread. wait() rethrows the error the operation stored. A Work may be copied; all copies share
// one state.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "tessera/comm/options.h"

namespace tessera::comm {

class FlightRecorder;  // flight_recorder.h

namespace detail {
struct WorkState;
}

class [[nodiscard]] Work {
 public:
  Work() = default;  // completed, no error
  static Work failed(std::exception_ptr e);
  // Used by backends: completed via complete(). The time a wait() blocks on it is added to
  // `recorder`'s wait time (null: not counted).
  static Work pending(std::string description, std::shared_ptr<FlightRecorder> recorder = nullptr);

  bool is_completed() const;
  // Blocks until the operation completes, then rethrows its error, if any. With a timeout, a wait
  // that does not complete in time throws TimeoutError naming the op (the operation itself keeps
  // its own per-call deadline, so a wait without a timeout is bounded too).
  void wait(std::optional<Timeout> timeout = std::nullopt) const;
  // The stored error, or null. Only meaningful once is_completed().
  std::exception_ptr exception() const;

  // Backend side: mark the operation finished (err null = success). Called once.
  void complete(std::exception_ptr err) const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace tessera::comm
