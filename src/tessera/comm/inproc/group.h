// Internal state of the in-process backend: the world (poison flag, exited ranks) and a group (the
// shared half of one communicator: per-rank slots with published buffer pointers, progress
// counters, small-message staging areas and point-to-point mailboxes).
//
// Synchronisation: each rank owns cache-line-padded monotonic counters (arrived, step, done) that
// only it writes, with release stores; peers read them with acquire loads. A rank publishes its
// buffers in its slot (double-buffered by sequence parity), then bumps `arrived` to the
// collective's sequence number. Waits spin briefly, then yield, then sleep on the group's condition
// variable in short slices; every slow-path iteration checks the world's poison flag, exited peers
// and the deadline, so no wait can hang.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/comm/errors.h"
#include "tessera/comm/op.h"
#include "tessera/comm/options.h"

namespace tessera::comm::inproc {

struct WorldState {
  int size = 0;
  CommOptions opts;
  std::atomic<bool> poisoned{false};
  mutable std::mutex mu;
  std::string reason;  // first poison reason; guarded by mu
  std::unique_ptr<std::atomic<bool>[]> exited;
  bool oversubscribed = false;  // more ranks than hardware threads: spin less

  void poison(const std::string& why);
  std::string poison_reason() const;
};

struct alignas(64) Counter {
  std::atomic<uint64_t> v{0};
};

struct SlotData {
  detail::Fingerprint fp;
  const void* send = nullptr;
  void* recv = nullptr;
  const size_t* send_counts = nullptr;  // AllToAllV
  const size_t* recv_counts = nullptr;
  int color = 0, key = 0;  // Split
  int algo = -1;           // AllReduce: the algorithm this rank chose
  std::shared_ptr<struct Group> split_result;
  unsigned char* staging = nullptr;  // small_max_bytes, 64-byte aligned
};

// A point-to-point message in its destination's mailbox. send() is eager: `data` holds a copy.
// send_recv() lends its buffer instead: the receiver copies from `lent` and then sets `*consumed`
// under the sender's mailbox lock and notifies that mailbox; the sender waits for it before it
// returns (or takes the message back out of the queue when it fails first).
struct Message {
  int src = 0;
  int tag = 0;
  DType dtype = DType::F32;
  size_t count = 0;
  std::vector<unsigned char> data;
  const void* lent = nullptr;
  std::atomic<bool>* consumed = nullptr;  // non-null: a lent message
};

struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Message> q;
  // Bumped, under `mu`, whenever a message arrives or one this rank lent is consumed, so a
  // waiter can spin on it without the lock.
  std::atomic<uint64_t> version{0};

  // Under `mu`: records a change and wakes the waiters.
  void changed() { version.fetch_add(1, std::memory_order_release); }
  // Between two checks of a point-to-point wait (`lk` holds `mu`): spins while nothing changes
  // (iteration 0), then yields (iterations 1-199), then sleeps on `cv` in slices of at most 2 ms,
  // as wait_counters does; never past `deadline`.
  void idle(std::unique_lock<std::mutex>& lk, int iter,
            std::chrono::steady_clock::time_point deadline, bool oversubscribed);
};

struct Group {
  Group(std::shared_ptr<WorldState> world, std::vector<int> world_ranks, std::string name);

  std::shared_ptr<WorldState> world;
  int n = 0;
  std::vector<int> world_ranks;  // group rank -> world rank
  CommOptions opts;              // opts.name is this group's name
  size_t staging_bytes = 0;

  std::unique_ptr<Counter[]> arrived, step, done;
  // Direct all-reduce work queue: (low 32 bits of the collective's sequence number) << 32 | the
  // next unclaimed block. Only ranks inside that collective touch it.
  Counter blocks_claimed;
  std::vector<SlotData> slots;  // [rank * 2 + parity]
  std::unique_ptr<unsigned char[]> staging_mem;
  std::unique_ptr<Mailbox[]> mail;  // by destination rank

  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> sleepers{0};

  SlotData& slot(int rank, uint64_t seq) {
    return slots[static_cast<size_t>(rank) * 2 + (seq & 1)];
  }
  // Publishes a counter value and wakes sleeping waiters.
  void publish(Counter& c, uint64_t value) {
    c.v.store(value, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard lk(mu); }
      cv.notify_all();
    }
  }
};

// What a wait is for, to name it in errors.
struct WaitCtx {
  Group* g;
  int rank;
  const detail::OpDesc* desc;  // may be null (split)
  std::string_view what;       // used when desc is null
  std::chrono::steady_clock::time_point deadline;
  std::string describe() const;  // "all_reduce #3 (F32 x 8, sum) on communicator 'world' rank 1/4"
};

// The wait loop of the inproc backend: every wait that fails when it cannot complete (counters of
// collectives and split, point-to-point receives and send_recv) runs this loop and no other.
// Returns once `done()` is true (checked first, so a wait that need not wait costs one call).
// Otherwise, in this order, until it is:
//   - a poisoned world fails the wait: PeerFailedError "<ctx> aborted: <poison reason>";
//   - `peer_left()` throws PeerFailedError when an awaited peer has returned from its function
//     (after a last look for what it may have left behind); it returns true when it found
//     something, and done() is then checked again at once;
//   - past the deadline, `missing()` says what the wait still waits for; empty, it has all
//     arrived at the last moment and the wait returns; else TimeoutError "<ctx>: timed out after
//     <timeout> ms waiting for <missing()>";
//   - `idle(iter)` (iter = 0, 1, ...) waits a little: it spins at first, then yields, then sleeps
//     on a condition variable in slices of at most 2 ms, never past the deadline.
// The cleanup waits of a rank that has already failed (quiesce, withdraw) are bounded and never
// fail, and do not use this loop: they must not stop at the poison flag.
template <typename Done, typename PeerLeft, typename Missing, typename Idle>
void wait_until(const WaitCtx& ctx, Done&& done, PeerLeft&& peer_left, Missing&& missing,
                Idle&& idle) {
  const WorldState& w = *ctx.g->world;
  for (int iter = 0;; ++iter) {
    if (done()) return;
    if (w.poisoned.load(std::memory_order_acquire))
      throw PeerFailedError(ctx.describe() + " aborted: " + w.poison_reason());
    if (peer_left()) continue;
    if (std::chrono::steady_clock::now() >= ctx.deadline) {
      const std::string m = missing();
      if (m.empty()) return;
      throw TimeoutError(detail::concat(ctx.describe(), ": timed out after ",
                                        ctx.desc ? ctx.desc->timeout.count() : 0,
                                        " ms waiting for ", m));
    }
    idle(iter);
  }
}

// Waits until counters[p].v >= target for every rank p of the group, or only for `only` when
// only >= 0 (wait_until). Throws PeerFailedError (poisoned world, exited peer) or TimeoutError
// naming the missing ranks and the `phase` ("waiting for ranks 1,2 to arrive").
void wait_counters(const WaitCtx& ctx, const Counter* counters, uint64_t target, int only = -1,
                   std::string_view phase = "to arrive");

}  // namespace tessera::comm::inproc
