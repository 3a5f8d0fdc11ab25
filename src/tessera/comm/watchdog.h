// A deadline for a call that has none of its own. Some MPI calls block until every rank of the
// communicator takes part (MPI_Comm_split, MPI_Comm_dup); a rank that has left would keep them
// waiting forever. A Watchdog guards such a call: constructed before it, destroyed after it. If it
// is still alive when the timeout passes, it prints "tessera: error: <message>" to stderr and ends
// the process with status 1, as a crash would (no destructors, no MPI_Finalize; mpirun sees the
// status and ends the job).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "tessera/comm/options.h"

namespace tessera::comm::detail {

class Watchdog {
 public:
  // message is called only when the watchdog fires (formatting costs nothing otherwise).
  Watchdog(Timeout timeout, std::function<std::string()> message);
  ~Watchdog();  // disarms it and joins its thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

}  // namespace tessera::comm::detail
