// One file-writing job at a time on a thread of its own: what `--save-async` writes checkpoints
// with (docs/RELIABILITY.md). The caller hands over a job that owns everything it writes (host
// copies, never views of memory the caller goes on changing), goes on working, and collects the
// outcome: poll() between steps, wait() when it must know (before the next job, at the end of a
// run, on a stop or an error), each wait bounded.
//
// At most one job is in flight: start() requires the previous one collected, so the memory held
// is that of one job. The job's thread runs at a lower priority than the caller's threads (nice
// + `nice_increment` on Linux), so that the write takes the cycles training leaves.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace tessera::io {

class BackgroundWriter {
 public:
  // The job: writes, returns what it wrote (a path, shown to the user); what it throws is the
  // job's failure, rethrown to the caller by poll() or wait().
  using Job = std::function<std::string()>;

  explicit BackgroundWriter(int nice_increment = 5);
  // Waits for a job in flight (without bound; a caller that must not wait forever calls wait()
  // first) and drops its outcome.
  ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Starts `job`, described by `what` ("checkpoint step 20 to 'runs/x'") in messages. Throws
  // Error when a job is in flight or its outcome has not been collected.
  void start(std::string what, Job job);
  // True from start() until poll() or wait() has collected the outcome.
  bool busy() const { return state_ != nullptr; }
  const std::string& what() const { return what_; }

  // Without blocking: nothing when no job is in flight or it has not finished; else the job's
  // result (the job is collected), or its exception rethrown (collected as well).
  std::optional<std::string> poll();
  // Blocks until the job finishes, at most `timeout`: its result, or its exception rethrown. Past
  // the timeout: an IoError naming the job and the timeout (`timeout_name`, e.g. "--io-timeout");
  // the job is abandoned (its thread detached: it finishes or not on its own, and keeps what it
  // owns alive), and the writer is free again. Precondition: busy().
  std::string wait(std::chrono::milliseconds timeout, const std::string& timeout_name);

 private:
  struct State;
  std::string collect();  // the finished job's result or exception; frees the slot

  int nice_increment_;
  std::shared_ptr<State> state_;  // the job in flight, shared with its thread
  std::string what_;
};

}  // namespace tessera::io
