#include "tessera/comm/work.h"

#include <condition_variable>
#include <mutex>

#include "tessera/comm/errors.h"
#include "tessera/comm/flight_recorder.h"

namespace tessera::comm {

namespace detail {
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::string description;
  std::shared_ptr<FlightRecorder> recorder;  // counts the time waits block
};
}  // namespace detail

namespace {
void wait_blocking(detail::WorkState& s, std::unique_lock<std::mutex>& lk,
                   std::optional<Timeout> timeout) {
  if (timeout && *timeout >= Timeout::zero()) {
    if (!s.cv.wait_for(lk, *timeout, [&] { return s.done; }))
      throw TimeoutError(detail::concat("wait for ", s.description, " did not complete within ",
                                        timeout->count(), " ms"));
  } else {
    s.cv.wait(lk, [&] { return s.done; });
  }
  if (s.error) std::rethrow_exception(s.error);
}
}  // namespace

Work Work::failed(std::exception_ptr e) {
  Work w;
  w.state_ = std::make_shared<detail::WorkState>();
  w.state_->done = true;
  w.state_->error = std::move(e);
  return w;
}

Work Work::pending(std::string description, std::shared_ptr<FlightRecorder> recorder) {
  Work w;
  w.state_ = std::make_shared<detail::WorkState>();
  w.state_->description = std::move(description);
  w.state_->recorder = std::move(recorder);
  return w;
}

bool Work::is_completed() const {
  if (!state_) return true;
  std::lock_guard lk(state_->mu);
  return state_->done;
}

void Work::wait(std::optional<Timeout> timeout) const {
  if (!state_) return;
  std::unique_lock lk(state_->mu);
  if (!state_->done && state_->recorder) {
    // Blocked: the time counts as this rank's communication wait (straggler metrics).
    const auto t0 = std::chrono::steady_clock::now();
    struct Count {
      FlightRecorder& r;
      std::chrono::steady_clock::time_point t0;
      ~Count() { r.add_wait(std::chrono::steady_clock::now() - t0); }
    } count{*state_->recorder, t0};
    wait_blocking(*state_, lk, timeout);
    return;
  }
  wait_blocking(*state_, lk, timeout);
}

std::exception_ptr Work::exception() const {
  if (!state_) return nullptr;
  std::lock_guard lk(state_->mu);
  return state_->error;
}

void Work::complete(std::exception_ptr err) const {
  if (!state_) return;
  {
    std::lock_guard lk(state_->mu);
    state_->done = true;
    state_->error = std::move(err);
  }
  state_->cv.notify_all();
}

}  // namespace tessera::comm
