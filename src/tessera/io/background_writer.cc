#include "tessera/io/background_writer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "tessera/core/error.h"

namespace tessera::io {

struct BackgroundWriter::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string result;
  std::exception_ptr error;
  std::thread thread;
};

namespace {

// Lowers the calling thread's priority by `increment` (Linux: nice values are per thread).
void lower_priority(int increment) {
  if (increment <= 0) return;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return;
  (void)::setpriority(PRIO_PROCESS, tid, std::min(19, now + increment));  // best effort
}

}  // namespace

BackgroundWriter::BackgroundWriter(int nice_increment) : nice_increment_(nice_increment) {}

BackgroundWriter::~BackgroundWriter() {
  if (!state_) return;
  if (state_->thread.joinable()) state_->thread.join();
}

void BackgroundWriter::start(std::string what, Job job) {
  TESSERA_CHECK(!state_, "a background write (", what_, ") is still in flight; wait for it before ",
                what);
  auto state = std::make_shared<State>();
  what_ = std::move(what);
  const int nice = nice_increment_;
  // The thread owns the job (and what it holds) and shares the state; the job is destroyed, and
  // its memory freed, before the outcome is published.
  state->thread = std::thread([s = state, job = std::move(job), nice]() mutable {
    lower_priority(nice);
    std::string result;
    std::exception_ptr error;
    try {
      result = job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->result = std::move(result);
      s->error = error;
      s->done = true;
    }
    s->cv.notify_all();
  });
  state_ = std::move(state);
}

std::string BackgroundWriter::collect() {
  std::shared_ptr<State> s = std::move(state_);
  if (s->thread.joinable()) s->thread.join();
  if (s->error) std::rethrow_exception(s->error);
  return std::move(s->result);
}

std::optional<std::string> BackgroundWriter::poll() {
  if (!state_) return std::nullopt;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->done) return std::nullopt;
  }
  return collect();
}

std::string BackgroundWriter::wait(std::chrono::milliseconds timeout,
                                   const std::string& timeout_name) {
  TESSERA_CHECK(state_ != nullptr, "no background write to wait for");
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) {
      lock.unlock();
      std::shared_ptr<State> s = std::move(state_);
      s->thread.detach();  // it keeps the state (and its job) alive until it ends
      throw IoError(detail::concat("the background write of ", what_, " did not finish within ",
                                   timeout_name, " (", timeout.count() / 1000.0,
                                   " s); it was abandoned, so that checkpoint may be missing, "
                                   "and an earlier complete one is still there"));
    }
  }
  return collect();
}

}  // namespace tessera::io
