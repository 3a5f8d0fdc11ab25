#include "tessera/comm/watchdog.h"

#include <cstdio>
#include <cstdlib>

namespace tessera::comm::detail {

Watchdog::Watchdog(Timeout timeout, std::function<std::string()> message)
    : thread_([this, timeout, message = std::move(message)] {
        std::unique_lock<std::mutex> lock(mutex_);
        if (done_cv_.wait_for(lock, timeout, [this] { return done_; })) return;
        std::fprintf(stderr, "tessera: error: %s\n", message().c_str());
        std::fflush(nullptr);
        std::_Exit(1);
      }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_one();
  thread_.join();
}

}  // namespace tessera::comm::detail
