// The in-process backend's public entry: a world of N ranks that are threads of this process.
// Usually reached through run_inproc() (launch.h); use InprocWorld directly to manage the threads
// yourself (benchmarks, custom test harnesses).
#pragma once

#include <memory>
#include <string>

#include "tessera/comm/communicator.h"

namespace tessera::comm {

namespace inproc {
struct WorldState;
struct Group;
}  // namespace inproc

class InprocWorld {
 public:
  // The shared state of `size` thread-ranks; options are resolved (timeout, debug) here.
  static std::shared_ptr<InprocWorld> create(int size, const CommOptions& opts = {});
  int size() const;
  const CommOptions& options() const;

  // Rank `rank`'s communicator over the whole world. Call once per rank; use it from one thread
  // at a time. It may outlive the InprocWorld handle (it shares the state).
  std::unique_ptr<Communicator> communicator(int rank);

  // Poisons the world: every rank waiting in, or later entering, any call on any communicator of
  // this world fails with PeerFailedError quoting `reason`. The first reason wins.
  void fail(int rank, const std::string& reason);
  // Marks `rank` finished (its function returned): peers waiting for it fail at once instead of
  // timing out. Call only after the rank's communicators are destroyed or idle.
  void exited(int rank);
  bool poisoned() const;

  explicit InprocWorld(std::shared_ptr<inproc::WorldState> s) : state_(std::move(s)) {}

 private:
  std::shared_ptr<inproc::WorldState> state_;
  std::shared_ptr<inproc::Group> world_group_;  // created by the first communicator() call
};

}  // namespace tessera::comm
