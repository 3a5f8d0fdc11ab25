#include "tessera/train/stop_request.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace tessera::train {

namespace {

// Lock-free atomics: safe to touch from a signal handler.
std::atomic<int> requested{0};
std::atomic<int> received{0};
std::atomic<bool> announce_first{true};
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGUSR1};
struct sigaction previous[3];
bool installed[3] = {false, false, false};
std::atomic<unsigned> dumps{0};
struct sigaction previous_usr2;
bool installed_usr2 = false;
static_assert(std::atomic<unsigned>::is_always_lock_free);

void on_dump_signal(int) {
  dumps.fetch_add(1);
}

void write_stderr(const char* s) {
  ssize_t ignored = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

void on_signal(int signo) {
  if (received.fetch_add(1) == 0) {
    requested.store(signo);
    if (announce_first.load()) {
      write_stderr("\ntessera: ");
      write_stderr(signal_name(signo));
      write_stderr(
          " received: stopping after the current step (a checkpoint is saved when --save is "
          "set); send it again to stop at once\n");
    }
    return;
  }
  write_stderr("\ntessera: second signal: stopping at once\n");
  std::signal(signo, SIG_DFL);
  std::raise(signo);
}

}  // namespace

StopSignals::StopSignals(bool announce) {
  clear_stop_request();
  announce_first.store(announce);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < 3; ++i) {
    sigaction(kSignals[i], nullptr, &previous[i]);
    // A SIGINT ignored by whoever started us (a background job of a script) stays ignored.
    installed[i] = !(kSignals[i] == SIGINT && previous[i].sa_handler == SIG_IGN);
    if (installed[i]) sigaction(kSignals[i], &sa, nullptr);
  }
  sa.sa_handler = on_dump_signal;
  installed_usr2 = sigaction(SIGUSR2, &sa, &previous_usr2) == 0;
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i)
    if (installed[i]) sigaction(kSignals[i], &previous[i], nullptr);
  if (installed_usr2) sigaction(SIGUSR2, &previous_usr2, nullptr);
}

unsigned dump_requests() {
  return dumps.load(std::memory_order_relaxed);
}

void request_dump() {
  dumps.fetch_add(1);
}

int stop_requested() {
  return requested.load(std::memory_order_relaxed);
}

void request_stop(int signo) {
  requested.store(signo);
}

void clear_stop_request() {
  requested.store(0);
  received.store(0);
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return "a signal";
  }
}

}  // namespace tessera::train
