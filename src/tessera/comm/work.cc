#include "tessera/comm/work.h"

#include <condition_variable>
#include <mutex>

#include "tessera/comm/errors.h"

namespace tessera::comm {

namespace detail {
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::string description;
};
}  // namespace detail

Work Work::failed(std::exception_ptr e) {
  Work w;
  w.state_ = std::make_shared<detail::WorkState>();
  w.state_->done = true;
  w.state_->error = std::move(e);
  return w;
}

Work Work::pending(std::string description) {
  Work w;
  w.state_ = std::make_shared<detail::WorkState>();
  w.state_->description = std::move(description);
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
  if (timeout && *timeout >= Timeout::zero()) {
    if (!state_->cv.wait_for(lk, *timeout, [&] { return state_->done; }))
      throw TimeoutError(detail::concat("wait for ", state_->description,
                                        " did not complete within ", timeout->count(), " ms"));
  } else {
    state_->cv.wait(lk, [&] { return state_->done; });
  }
  if (state_->error) std::rethrow_exception(state_->error);
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
