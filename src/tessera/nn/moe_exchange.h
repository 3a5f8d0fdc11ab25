// The asynchronous exchanges of an expert-parallel MoE layer (moe.h): rows of C floats between the
// ranks of the expert group, each posted on the group's progress thread so that the caller can run
// its own experts while the rows travel, and recorded on the timeline ("comm" track) from the
// moment it is posted to the moment its completion is seen.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/core/trace.h"

namespace tessera::nn {

class PendingExchange {
 public:
  PendingExchange() = default;  // nothing in flight
  // `category`: the timeline category of the exchange's span ("moe"; "cp" for the attention's).
  PendingExchange(comm::Work work, std::string label, const char* category = "moe");
  PendingExchange(PendingExchange&&) = default;
  PendingExchange& operator=(PendingExchange&&) = default;
  // A destroyed exchange that was posted and never waited for is waited for (errors swallowed):
  // the buffers it reads and writes outlive it only as long as the caller's frame.
  ~PendingExchange();

  bool posted() const { return posted_; }
  // Whether it has finished (successfully or not); never blocks. False when not posted.
  bool done() const;
  // Blocks until it finishes and rethrows its error; records the exchange's span the first time,
  // and the time the caller spent blocked here as a "wait for <label>" span on the compute track.
  // Nothing to do when not posted.
  void wait();

 private:
  comm::Work work_;
  std::string label_;
  const char* category_ = "moe";
  TraceClock::time_point start_{};
  Tracer* tracer_ = nullptr;
  bool posted_ = false, recorded_ = false;
};

// Posts rows of C floats: send_rows[j] rows of `send` (packed in rank order) to rank j, and
// recv_rows[j] rows from rank j into `recv` (packed in rank order). The rows to and from this
// rank itself must be 0 (the caller keeps its own rows in place).
PendingExchange post_rows(comm::Communicator& group, const float* send,
                          const std::vector<size_t>& send_rows, float* recv,
                          const std::vector<size_t>& recv_rows, int C, std::string label);

// Posts the per-expert row counts: block j of send (`per_rank` counts) goes to rank j, and block j
// of recv comes from rank j.
PendingExchange post_counts(comm::Communicator& group, const int64_t* send, int64_t* recv,
                            int per_rank, std::string label);

}  // namespace tessera::nn
