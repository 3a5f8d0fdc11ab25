#include "tessera/comm/mpi/hier_comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tessera/comm/mpi/runtime.h"
#include "tessera/comm/reduce.h"
#include "tessera/comm/watchdog.h"

namespace tessera::comm::mpi {
namespace {

using detail::OpDesc;
using detail::OpType;
using Clock = std::chrono::steady_clock;
namespace rt = runtime_access;

// MPI tags: a communicator's id in the high bits (ids are unique among the communicators that
// share a pair of ranks), the stream of messages in the low ones.
constexpr int kIdBits = 10;
constexpr int kStreamBits = 20;
enum Stream : int {
  kChain = 1,
  kResult = 2,
  kGather = 3,
  kBroadcast = 4,
  kAllToAll = 5,
  kFingerprints = 6  // debug mode (HierCommunicator::group_fingerprints)
};
constexpr int kUserTags = 1024;  // send/recv tag t travels as stream kUserTags + t
constexpr int kMaxUserTag = (1 << kStreamBits) - kUserTags - 1;

// Chain segments: a received segment is reduced while the next ones are still arriving, and a rank
// keeps a bounded number of its sends in flight. Between hosts (TCP) segments stay below Open
// MPI's eager limit (64 KiB), so that they travel without a rendezvous: a larger message waits
// for a clear-to-send from its receiver, and that control message queues on the pair's one
// connection behind the data going the other way (the result travels back while partial sums
// still travel forward). 1 MiB segments took 0.96-1.19 s for 64 MiB at 1 Gbit/s, 60 KiB ones
// 0.68 s, where a TCP transfer each way at once takes 0.56 s. Inside one host (shared memory)
// 1 MiB segments were about 20% faster at 16-64 MiB (docs/PERFORMANCE.md).
struct Segments {
  size_t bytes;
  size_t in_flight;
};
constexpr Segments kAcrossHosts{60 * 1024, 64};
constexpr Segments kOneHost{1 << 20, 4};

}  // namespace

// The members of one communicator that live in this process: their published buffers, how far
// each has got, and the in-memory mailboxes between them.
struct LocalShared {
  explicit LocalShared(int n) : slots(n), phase(n, 0) {}
  struct Slot {
    const void* send = nullptr;
    void* recv = nullptr;
    const size_t* send_counts = nullptr;
    const size_t* recv_counts = nullptr;
    detail::Fingerprint fp;
  };
  struct Message {
    DType dtype = DType::F32;
    size_t count = 0;
    std::vector<unsigned char> data;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Slot> slots;                                        // by local index; owner writes
  std::vector<uint64_t> phase;                                    // by local index; under mu
  std::map<std::tuple<int, int, int>, std::deque<Message>> mail;  // (src, dst, tag); under mu
  // Debug mode: the fingerprints of every member of the communicator, by rank; the first member
  // here writes them (HierCommunicator::group_fingerprints).
  std::vector<detail::Fingerprint> group_fps;
};

struct HierWorld {
  int procs = 1, proc = 0, threads = 1;
  std::vector<int> host_of_proc;  // an index per distinct MPI_Get_processor_name
  CommOptions opts;
  bool oversubscribed = false;
  std::vector<MPI_Comm> lanes;  // lanes[from_thread * threads + to_thread]
  std::atomic<bool> poisoned{false};
  std::atomic<bool> abandoned{false};  // a request was left in flight: keep the lanes
  std::mutex mu;
  std::string reason;                                               // under mu
  std::map<std::vector<int>, std::weak_ptr<LocalShared>> registry;  // under mu
  std::unique_ptr<std::atomic<int>[]> next_id;                      // by thread

  MPI_Comm lane(int from_thread, int to_thread) const {
    return lanes[static_cast<size_t>(from_thread) * threads + to_thread];
  }
  void poison(const std::string& why) {
    std::lock_guard lk(mu);
    if (!poisoned.load()) reason = why;
    poisoned.store(true, std::memory_order_release);
  }
  std::string poison_reason() {
    std::lock_guard lk(mu);
    return reason;
  }
  // The members of communicator `key` ({id, world ranks...}) in this process share one state.
  std::shared_ptr<LocalShared> local_state(const std::vector<int>& key, int local_members) {
    std::lock_guard lk(mu);
    if (auto s = registry[key].lock()) return s;
    auto s = std::make_shared<LocalShared>(local_members);
    registry[key] = s;
    return s;
  }
  ~HierWorld() {
    if (abandoned.load()) return;  // requests still in flight: leak rather than free
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Comm& c : lanes) MPI_Comm_free(&c);
  }
};

namespace {

inline float bf16_value(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// dst = acc (op) srcs[0] (op) srcs[1] ..., left to right, for `m` elements; acc may be null.
// The partial result (final == false) of bf16 is fp32 (acc too); otherwise acc, the sources and
// dst have `dtype`. final: divides by `mean_divisor` for Mean; bf16 is rounded here only.
void fold(void* dst, const void* acc, std::span<const void* const> srcs, size_t m, DType dtype,
          ReduceOp op, bool final, int mean_divisor) {
  if (m == 0) return;
  const int div = final && op == ReduceOp::Mean ? mean_divisor : 0;
  if (dtype != DType::BF16) {
    std::vector<const void*> all;
    all.reserve(srcs.size() + 1);
    if (acc) all.push_back(acc);
    all.insert(all.end(), srcs.begin(), srcs.end());
    detail::reduce_n(dst, all.data(), static_cast<int>(all.size()), m, dtype,
                     op == ReduceOp::Mean && !final ? ReduceOp::Sum : op, div);
    return;
  }
  constexpr size_t kBlock = 1024;
  float a[kBlock];
  for (size_t b = 0; b < m; b += kBlock) {
    const size_t n = std::min(kBlock, m - b);
    size_t first = 0;
    if (acc) {
      std::memcpy(a, static_cast<const float*>(acc) + b, n * sizeof(float));
    } else {
      const auto* s0 = static_cast<const uint16_t*>(srcs[0]) + b;
      for (size_t i = 0; i < n; ++i) a[i] = bf16_value(s0[i]);
      first = 1;
    }
    for (size_t j = first; j < srcs.size(); ++j) {
      const auto* s = static_cast<const uint16_t*>(srcs[j]) + b;
      for (size_t i = 0; i < n; ++i) {
        const float x = bf16_value(s[i]);
        a[i] = op == ReduceOp::Max   ? (a[i] < x ? x : a[i])
               : op == ReduceOp::Min ? (x < a[i] ? x : a[i])
                                     : a[i] + x;
      }
    }
    if (!final) {
      std::memcpy(static_cast<float*>(dst) + b, a, n * sizeof(float));
      continue;
    }
    if (div > 0)
      for (size_t i = 0; i < n; ++i) a[i] /= static_cast<float>(div);
    auto* out = static_cast<uint16_t*>(dst) + b;
    for (size_t i = 0; i < n; ++i) out[i] = to_bf16(a[i]).bits;
  }
}

// A run: consecutive ranks of a communicator in one process.
struct ProcessRun {
  int proc = 0;
  int first = 0, size = 0;  // ranks first .. first + size - 1
};

// Scratch memory of one communicator's calls, kept from one call to the next (a rank's calls run
// one at a time). Allocated afresh, a buffer of 32 MiB or more is a new mapping on every call
// (glibc's largest mmap threshold), and its first touch faults in and zeroes every page: the
// chain of a 64 MiB all-reduce holds 32 MiB a rank. It keeps the kKept largest buffers of at least
// kKeepFrom bytes it got back (a smaller one is an ordinary allocation, so that a small receive
// does not take a chain's buffer); its buffers are uninitialised.
class Scratch {
 public:
  struct Buffer {
    std::unique_ptr<unsigned char[]> data;
    size_t bytes = 0;
  };
  Buffer take(size_t bytes) {
    auto best = kept_.end();  // the smallest kept buffer that holds `bytes`
    for (auto it = kept_.begin(); it != kept_.end() && bytes >= kKeepFrom; ++it)
      if (it->bytes >= bytes && (best == kept_.end() || it->bytes < best->bytes)) best = it;
    if (best == kept_.end())
      return {std::unique_ptr<unsigned char[]>(new unsigned char[bytes]), bytes};
    Buffer b = std::move(*best);
    kept_.erase(best);
    return b;
  }
  void give(Buffer b) {
    if (b.bytes < kKeepFrom) return;
    kept_.push_back(std::move(b));
    if (kept_.size() <= kKept) return;
    kept_.erase(std::min_element(kept_.begin(), kept_.end(), [](const Buffer& x, const Buffer& y) {
      return x.bytes < y.bytes;
    }));
  }

 private:
  static constexpr size_t kKept = 4;
  static constexpr size_t kKeepFrom = size_t{1} << 20;
  std::vector<Buffer> kept_;
};

class HierCommunicator final : public Communicator {
 public:
  HierCommunicator(std::shared_ptr<HierWorld> w, int thread, std::vector<int> world_ranks, int rank,
                   int id, CommOptions opts)
      : Communicator(std::move(opts)),
        w_(std::move(w)),
        thread_(thread),
        world_ranks_(std::move(world_ranks)),
        rank_(rank),
        id_(id) {
    const int n = size();
    local_index_.assign(n, -1);
    for (int g = 0; g < n; ++g) {
      if (runs_.empty() || runs_.back().proc != proc_of(g)) runs_.push_back({proc_of(g), g, 0});
      ++runs_.back().size;
      if (proc_of(g) == w_->proc) {
        local_index_[g] = static_cast<int>(local_.size());
        local_.push_back(g);
      }
      auto& members = by_proc_[proc_of(g)];
      members.push_back(g);
    }
    for (int g = 0; g < n; ++g)
      if (w_->host_of_proc[proc_of(g)] != w_->host_of_proc[proc_of(0)]) segments_ = kAcrossHosts;
    for (size_t j = 0; j < runs_.size(); ++j)
      if (rank_ >= runs_[j].first && rank_ < runs_[j].first + runs_[j].size)
        my_run_ = static_cast<int>(j);
    std::vector<int> key = {id_};
    key.insert(key.end(), world_ranks_.begin(), world_ranks_.end());
    L_ = w_->local_state(key, static_cast<int>(local_.size()));
  }
  ~HierCommunicator() override {
    stop_progress_thread();
    const auto until = Clock::now() + (abandoned_ ? Timeout{0} : options().timeout);
    for (auto& p : pending_) {
      int done = 0;
      while (!done && Clock::now() < until) {
        MPI_Test(&p.req, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::yield();
      }
      if (!done) {
        w_->abandoned.store(true);
        (void)new PendingSend(std::move(p));  // NOLINT: owned by MPI from now on
      }
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  std::string_view backend() const override { return "hier"; }
  int world_rank() const override { return world_ranks_[rank_]; }

 protected:
  void execute(const OpDesc& d) override;
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& child_name,
                                         Timeout timeout) override;
  void on_failure(const std::exception_ptr& e) override {
    w_->poison(detail::concat("rank ", rank_, " of communicator '", name(), "' (world rank ",
                              world_rank(), ") failed: ", what_of(e)));
  }
  bool world_failed() const override { return w_->poisoned.load(std::memory_order_acquire); }
  // An injected exit ends the process, as on the MPI backend: its ranks end together.
  [[noreturn]] void exit_rank(const std::string& why, int status) override {
    exit_process(why, status);
  }

 private:
  int proc_of(int g) const { return world_ranks_[g] / w_->threads; }
  int thread_of(int g) const { return world_ranks_[g] % w_->threads; }
  bool is_local(int g) const { return local_index_[g] >= 0; }
  const LocalShared::Slot& slot(int g) const { return L_->slots[local_index_[g]]; }
  // The rank of run j that handles slice s.
  int handler(int j, int s) const { return runs_[j].first + s % runs_[j].size; }
  std::string peer(int g) const {
    return detail::concat("rank ", g, " (world rank ", world_ranks_[g], ", process ", proc_of(g),
                          ")");
  }
  int tag(int stream) const { return (id_ << kStreamBits) | stream; }

  // The steps of collective #ops_ at which the members in this process wait for each other, as
  // local_phase(phase(step)). Phase values only grow: kFinished of one collective is below
  // kArrived of the next.
  enum Step : uint64_t { kArrived = 1, kExchanged = 2, kBlocks = 3, kFinished = 4 };
  uint64_t phase(Step s) const { return ops_ * kFinished + s; }
  // The local phase barrier: publishes that this rank reached `value` and waits for the other
  // members in this process (deadline, poison).
  void local_phase(uint64_t value, const OpDesc& d, Clock::time_point deadline,
                   std::string_view what);
  // Waits on the process's condition variable (lk holds L_->mu) until done(); fails with
  // PeerFailedError when a rank of the process failed, or TimeoutError "... waiting for
  // <missing()>" at the deadline.
  template <typename Done, typename Missing>
  void wait_local(std::unique_lock<std::mutex>& lk, const OpDesc& d, Clock::time_point deadline,
                  Done&& done, Missing&& missing);
  void check_poison(const OpDesc& d) const {
    if (w_->poisoned.load(std::memory_order_acquire))
      throw PeerFailedError(where(d) + " aborted: " + w_->poison_reason());
  }
  // Polls until every request of `reqs` completed; on timeout cancels the receives, abandons
  // the rest and throws TimeoutError naming `waiting_for`.
  void wait_all(std::span<MPI_Request> reqs, Clock::time_point deadline, const OpDesc& d,
                const std::string& waiting_for, MPI_Status* statuses = MPI_STATUSES_IGNORE);
  MPI_Request isend(const void* buf, size_t count, DType dt, int to, int stream, const OpDesc& d);
  MPI_Request irecv(void* buf, size_t count, DType dt, int from, int stream, const OpDesc& d);

  void collective(const OpDesc& d);
  // Debug mode: the fingerprints of this collective of every member, by rank, from every process.
  std::vector<detail::Fingerprint> group_fingerprints(const OpDesc& d, Clock::time_point deadline);
  // all_reduce (scatter == false: every rank gets the whole result) and reduce_scatter (block b of
  // the result to rank b only): the chain of the header comment.
  void chain_reduce(const OpDesc& d, Clock::time_point deadline, bool scatter);
  void all_gather(const OpDesc& d, Clock::time_point deadline);
  void broadcast(const OpDesc& d, Clock::time_point deadline);
  void all_to_allv(const OpDesc& d, Clock::time_point deadline);
  void send(const OpDesc& d);
  void recv(const OpDesc& d, void* buf, size_t count, int from, int tag,
            Clock::time_point deadline);

  struct PendingSend {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<unsigned char> data;
  };
  void reap_sends();

  std::shared_ptr<HierWorld> w_;
  int thread_;
  std::vector<int> world_ranks_;  // rank here -> world rank
  int rank_;
  int id_;
  std::vector<ProcessRun> runs_;
  int my_run_ = 0;
  std::vector<int> local_;                   // the ranks in this process, in order
  std::vector<int> local_index_;             // rank -> index in local_, or -1
  std::map<int, std::vector<int>> by_proc_;  // process -> its ranks, in order
  std::shared_ptr<LocalShared> L_;
  uint64_t ops_ = 0;  // collectives run (splits included): the local phases' clock
  Segments segments_ = kOneHost;
  std::deque<PendingSend> pending_;
  std::vector<unsigned char> tmp_;
  Scratch scratch_;
  bool abandoned_ = false;
};

void HierCommunicator::local_phase(uint64_t value, const OpDesc& d, Clock::time_point deadline,
                                   std::string_view what) {
  if (local_.size() == 1) return;
  LocalShared& L = *L_;
  std::unique_lock lk(L.mu);
  L.phase[local_index_[rank_]] = value;
  L.cv.notify_all();
  wait_local(
      lk, d, deadline,
      [&] {
        return std::all_of(L.phase.begin(), L.phase.end(), [&](uint64_t p) { return p >= value; });
      },
      [&] {
        std::string missing;
        for (size_t i = 0; i < L.phase.size(); ++i)
          if (L.phase[i] < value) missing += detail::concat(missing.empty() ? "" : ",", local_[i]);
        return detail::concat("ranks ", missing, " (in this process) ", what);
      });
}

template <typename Done, typename Missing>
void HierCommunicator::wait_local(std::unique_lock<std::mutex>& lk, const OpDesc& d,
                                  Clock::time_point deadline, Done&& done, Missing&& missing) {
  while (!done()) {
    check_poison(d);
    if (Clock::now() >= deadline)
      throw TimeoutError(detail::concat(where(d), ": timed out after ", d.timeout.count(),
                                        " ms waiting for ", missing()));
    L_->cv.wait_for(lk, std::chrono::milliseconds(2));
  }
}

void HierCommunicator::wait_all(std::span<MPI_Request> reqs, Clock::time_point deadline,
                                const OpDesc& d, const std::string& waiting_for,
                                MPI_Status* statuses) {
  const auto yield_from =
      w_->oversubscribed ? Clock::time_point::min() : Clock::now() + std::chrono::milliseconds(1);
  for (long iter = 0;; ++iter) {
    int flag = 0;
    const int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, statuses);
    if (rc == MPI_ERR_IN_STATUS && statuses != MPI_STATUSES_IGNORE)
      for (size_t i = 0; i < reqs.size(); ++i)
        if (statuses[i].MPI_ERROR == MPI_ERR_TRUNCATE)
          throw MismatchError(
              detail::concat(where(d), ": a peer sent more elements than expected"));
    rt::check(rc, where(d));
    if (flag) return;
    if ((iter & 255) != 255) continue;
    const auto now = Clock::now();
    if (now >= deadline || w_->poisoned.load(std::memory_order_acquire)) break;
    if (now >= yield_from) std::this_thread::yield();
  }
  // Given up (a deadline, or a rank of this process failed): the requests may still use their
  // buffers, which the caller's RequestBuffers then keeps.
  for (MPI_Request& r : reqs)
    if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);  // receives; a send cannot be taken back
  abandoned_ = true;
  w_->abandoned.store(true);
  check_poison(d);
  throw TimeoutError(detail::concat(where(d), ": timed out after ", d.timeout.count(),
                                    " ms waiting for ", waiting_for));
}

MPI_Request HierCommunicator::isend(const void* buf, size_t count, DType dt, int to, int stream,
                                    const OpDesc& d) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (count > static_cast<size_t>(INT_MAX))
    throw CommUsageError(where(d) + ": more than INT_MAX elements in one message");
  rt::check(MPI_Isend(buf, static_cast<int>(count), rt::datatype(dt), proc_of(to), tag(stream),
                      w_->lane(thread_, thread_of(to)), &r),
            where(d));
  return r;
}

MPI_Request HierCommunicator::irecv(void* buf, size_t count, DType dt, int from, int stream,
                                    const OpDesc& d) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (count > static_cast<size_t>(INT_MAX))
    throw CommUsageError(where(d) + ": more than INT_MAX elements in one message");
  rt::check(MPI_Irecv(buf, static_cast<int>(count), rt::datatype(dt), proc_of(from), tag(stream),
                      w_->lane(thread_of(from), thread_), &r),
            where(d));
  return r;
}

void HierCommunicator::reap_sends() {
  while (!pending_.empty()) {
    int done = 0;
    MPI_Test(&pending_.front().req, &done, MPI_STATUS_IGNORE);
    if (!done) return;
    pending_.pop_front();
  }
}

void HierCommunicator::execute(const OpDesc& d) {
  check_poison(d);
  if (!pending_.empty()) reap_sends();
  const auto deadline = Clock::now() + d.timeout;
  switch (d.type) {
    case OpType::Send:
      return send(d);
    case OpType::Recv:
      return recv(d, d.recv, d.count, d.peer, d.tag, deadline);
    case OpType::SendRecv:
      if (d.peer == rank_ && d.recv_peer == rank_) return exchange_with_self(d);
      if (d.peer >= 0) send(d);
      if (d.recv_peer >= 0) recv(d, d.recv, d.recv_count, d.recv_peer, d.recv_tag, deadline);
      return;
    default:
      return collective(d);
  }
}

void HierCommunicator::collective(const OpDesc& d) {
  const auto deadline = Clock::now() + d.timeout;
  ++ops_;
  LocalShared::Slot& me = L_->slots[local_index_[rank_]];
  me.fp = detail::fingerprint_of(d);
  me.send = d.send;
  me.recv = d.recv;
  me.send_counts = d.send_counts.data();
  me.recv_counts = d.recv_counts.data();
  if ((d.type == OpType::AllToAll || d.type == OpType::AllToAllV) && d.send == d.recv) {
    const size_t in = d.type == OpType::AllToAll
                          ? d.count * static_cast<size_t>(size())
                          : std::accumulate(d.send_counts.begin(), d.send_counts.end(), size_t{0});
    tmp_.resize(in * dtype_size(d.dtype));
    if (in) std::memcpy(tmp_.data(), d.send, tmp_.size());
    me.send = tmp_.data();
  }
  // A barrier all-reduces this; it must outlive the last phase (peers read it until then).
  int32_t one = 1;
  local_phase(phase(kArrived), d, deadline, "to arrive");
  // The members here compare fingerprints on every call; in debug mode every member compares
  // every member's, from all processes, so that each gets the same MismatchError (else a
  // mismatch across processes would hang or mix data).
  if (options().debug && by_proc_.size() > 1) {
    detail::check_fingerprints(group_fingerprints(d, deadline), name(), rank_);
  } else {
    std::vector<detail::Fingerprint> fps;  // of the ranks in this process
    for (int g : local_) fps.push_back(slot(g).fp);
    detail::check_fingerprints(fps, local_, name(), rank_, size());
  }
  switch (d.type) {
    case OpType::AllReduce:
      chain_reduce(d, deadline, false);
      break;
    case OpType::ReduceScatter:
      chain_reduce(d, deadline, true);
      break;
    case OpType::AllGather:
      all_gather(d, deadline);
      break;
    case OpType::Broadcast:
      broadcast(d, deadline);
      break;
    case OpType::AllToAll:
    case OpType::AllToAllV:
      all_to_allv(d, deadline);
      break;
    case OpType::Barrier: {
      OpDesc b = d;
      b.type = OpType::AllReduce;
      b.send = b.recv = &one;
      b.count = 1;
      b.dtype = DType::I32;
      b.op = ReduceOp::Sum;
      me.send = me.recv = &one;
      local_phase(phase(kBlocks), d, deadline, "to arrive");
      chain_reduce(b, deadline, false);
      break;
    }
    default:
      throw CommUsageError(where(d) + ": unexpected operation");
  }
  local_phase(phase(kFinished), d, deadline, "to finish reading this rank's buffers");
}

// Buffers that MPI requests of one call read or write, from the communicator's scratch and back
// to it at the end of the call: after a timeout abandoned requests may still use them, so they
// are leaked rather than returned.
class RequestBuffers {
 public:
  RequestBuffers(const bool& abandoned, Scratch& scratch)
      : abandoned_(abandoned), scratch_(scratch) {}
  RequestBuffers(const RequestBuffers&) = delete;
  RequestBuffers& operator=(const RequestBuffers&) = delete;
  ~RequestBuffers() {
    for (Scratch::Buffer& b : bufs_)
      if (abandoned_)
        (void)b.data.release();  // NOLINT: owned by MPI from now on
      else
        scratch_.give(std::move(b));
  }
  unsigned char* add(size_t bytes) {
    bufs_.push_back(scratch_.take(bytes));
    return bufs_.back().data.get();  // moving the outer vector keeps each buffer where it is
  }

 private:
  const bool& abandoned_;
  Scratch& scratch_;
  std::vector<Scratch::Buffer> bufs_;
};

// The first member of each process sends the fingerprints its process's members published (at
// kArrived) to the first member of every other process, and receives theirs; its peers here wait
// for it at kExchanged, so that no member fails (and poisons the process) before all of them
// hold the same list. It writes L_->group_fps after kArrived, when the members here have read the
// previous collective's.
std::vector<detail::Fingerprint> HierCommunicator::group_fingerprints(const OpDesc& d,
                                                                      Clock::time_point deadline) {
  constexpr size_t fs = sizeof(detail::Fingerprint);
  if (rank_ == local_[0]) {
    std::vector<detail::Fingerprint>& all = L_->group_fps;
    all.resize(static_cast<size_t>(size()));
    RequestBuffers keep(abandoned_, scratch_);
    unsigned char* mine = keep.add(local_.size() * fs);
    for (size_t i = 0; i < local_.size(); ++i) {
      all[local_[i]] = slot(local_[i]).fp;
      std::memcpy(mine + i * fs, &all[local_[i]], fs);
    }
    std::vector<MPI_Request> reqs;
    std::vector<std::pair<const std::vector<int>*, const unsigned char*>> theirs;
    std::string from;
    for (const auto& [proc, ranks] : by_proc_) {
      if (proc == w_->proc) continue;
      reqs.push_back(isend(mine, local_.size() * fs, DType::U8, ranks[0], kFingerprints, d));
      unsigned char* in = keep.add(ranks.size() * fs);
      reqs.push_back(irecv(in, ranks.size() * fs, DType::U8, ranks[0], kFingerprints, d));
      theirs.emplace_back(&ranks, in);
      from += detail::concat(from.empty() ? "" : ", ", peer(ranks[0]));
    }
    wait_all(reqs, deadline, d,
             detail::concat("the other processes to reach this collective (debug mode: the "
                            "fingerprints of their ranks, from ",
                            from, ")"));
    for (const auto& [ranks, in] : theirs)
      for (size_t i = 0; i < ranks->size(); ++i) std::memcpy(&all[(*ranks)[i]], in + i * fs, fs);
  }
  local_phase(phase(kExchanged), d, deadline, "to receive the fingerprints of the other processes");
  return L_->group_fps;
}

void HierCommunicator::chain_reduce(const OpDesc& d, Clock::time_point deadline, bool scatter) {
  const int n = size();
  const int m = static_cast<int>(runs_.size());
  const int j = my_run_;
  const ProcessRun& run = runs_[j];
  const bool last = j == m - 1;
  const size_t es = dtype_size(d.dtype);
  const size_t total = scatter ? d.count * static_cast<size_t>(n) : d.count;
  // The partial results: fp32 for bf16 (rounded once, at the end).
  const DType wire = d.dtype == DType::BF16 ? DType::F32 : d.dtype;
  const size_t ws = dtype_size(wire);
  int slices = 0;
  for (const ProcessRun& r : runs_) slices = std::max(slices, r.size);
  auto slice_begin = [&](int s) {
    return total / slices * s + std::min<size_t>(s, total % slices);
  };
  const size_t seg = std::max<size_t>(1, segments_.bytes / ws);
  // Rank g's input and output at element e (all_reduce; reduce_scatter reads inputs only here).
  auto input = [&](int g, size_t e) {
    return static_cast<const unsigned char*>(slot(g).send) + e * es;
  };
  auto output = [&](int g, size_t e) { return static_cast<unsigned char*>(slot(g).recv) + e * es; };

  RequestBuffers keep(abandoned_, scratch_);
  std::vector<MPI_Request> sends, result_recvs;
  // Before another send: waits until at most segments_.in_flight - 1 sends are pending.
  size_t oldest = 0;
  auto throttle = [&] {
    for (; sends.size() - oldest >= segments_.in_flight; ++oldest)
      wait_all({&sends[oldest], 1}, deadline, d, "the next ranks of the chain to receive");
  };
  struct Span {
    size_t a, len;
  };
  std::vector<Span> held;  // all_reduce: result segments this rank holds, to copy to its peers
  std::vector<const void*> srcs(run.size);
  for (int s = 0; s < slices; ++s) {
    if (handler(j, s) != rank_) continue;
    const size_t sb = slice_begin(s), sl = slice_begin(s + 1) - sb;
    if (sl == 0) continue;
    const int prev = j > 0 ? handler(j - 1, s) : -1;
    const int next = last ? -1 : handler(j + 1, s);
    const int end = handler(m - 1, s);  // holds the result first
    unsigned char* in = prev >= 0 ? keep.add(sl * ws) : nullptr;
    unsigned char* out = last ? nullptr : keep.add(sl * ws);
    // The previous run's partial results, all posted at once.
    std::vector<MPI_Request> partials;
    for (size_t a = 0; prev >= 0 && a < sl; a += seg)
      partials.push_back(irecv(in + a * ws, std::min(seg, sl - a), wire, prev, kChain, d));
    for (size_t a = 0, i = 0; a < sl; a += seg, ++i) {
      const size_t len = std::min(seg, sl - a), e = sb + a;
      if (prev >= 0)
        wait_all({&partials[i], 1}, deadline, d, detail::concat(peer(prev), " to send"));
      for (int k = 0; k < run.size; ++k) srcs[k] = input(run.first + k, e);
      const void* acc = prev >= 0 ? in + a * ws : nullptr;
      if (!last) {
        fold(out + a * ws, acc, srcs, len, d.dtype, d.op, false, n);
        throttle();
        sends.push_back(isend(out + a * ws, len, wire, next, kChain, d));
        // The result comes back here unless the last run's handler is in this process (it then
        // writes every output here itself). Posted after this segment's input was read.
        if (!scatter && !is_local(end))
          result_recvs.push_back(irecv(output(rank_, e), len, d.dtype, end, kResult, d));
        continue;
      }
      if (!scatter) {
        // The result into this rank's output, then to one handler in each other process.
        fold(output(rank_, e), acc, srcs, len, d.dtype, d.op, true, n);
        for (int r = 0; r < m - 1; ++r) {
          const int h = handler(r, s);
          if (runs_[r].proc == w_->proc) continue;
          throttle();
          sends.push_back(isend(output(rank_, e), len, d.dtype, h, kResult, d));
        }
        held.push_back({e, len});
        continue;
      }
      // reduce_scatter: each block's part of the segment to its owner.
      unsigned char* res = keep.add(len * es);
      fold(res, acc, srcs, len, d.dtype, d.op, true, n);
      for (size_t x = e; x < e + len;) {
        const int b = static_cast<int>(x / d.count);
        const size_t stop = std::min(e + len, static_cast<size_t>(b + 1) * d.count);
        if (is_local(b))
          std::memcpy(static_cast<unsigned char*>(slot(b).recv) + (x - b * d.count) * es,
                      res + (x - e) * es, (stop - x) * es);
        else
          sends.push_back(isend(res + (x - e) * es, stop - x, d.dtype, b, kResult, d));
        x = stop;
      }
    }
    if (!last && !scatter && !is_local(end)) held.push_back({sb, sl});
  }
  // reduce_scatter: this rank's block, from the last run's handlers in other processes, in the
  // order they send it (slices, then segments, ascending).
  if (scatter) {
    const size_t bb = static_cast<size_t>(rank_) * d.count, be = bb + d.count;
    for (int s = 0; s < slices; ++s) {
      const int h = handler(m - 1, s);
      if (is_local(h)) continue;  // written in place by the handler
      const size_t sb = slice_begin(s), se = slice_begin(s + 1);
      for (size_t a = sb; a < se; a += seg) {
        const size_t from = std::max(a, bb), to = std::min(std::min(se, a + seg), be);
        if (from < to)
          result_recvs.push_back(irecv(static_cast<unsigned char*>(d.recv) + (from - bb) * es,
                                       to - from, d.dtype, h, kResult, d));
      }
    }
  }
  wait_all(result_recvs, deadline, d, "the end of the chain to send the result");
  wait_all(sends, deadline, d, "the next ranks of the chain to receive");
  // all_reduce: the held segments into the outputs of this rank's run in this process, and, on
  // the last run, into every output in this process (the other runs here received none).
  for (const Span& f : held)
    for (int g : local_) {
      const bool same_run = g >= run.first && g < run.first + run.size;
      if (g != rank_ && (same_run || last))
        std::memcpy(output(g, f.a), output(rank_, f.a), f.len * es);
    }
}

// Each rank's block reaches one rank of every other process (in turn over its ranks there), which
// receives it into its own output; then every rank copies the blocks it lacks from the outputs
// and inputs of the ranks in its process.
void HierCommunicator::all_gather(const OpDesc& d, Clock::time_point deadline) {
  const size_t bytes = d.count * dtype_size(d.dtype);
  auto* out = static_cast<unsigned char*>(d.recv);
  const auto receiver_in = [&](int proc, int g) {
    const std::vector<int>& there = by_proc_.at(proc);
    return there[static_cast<size_t>(g) % there.size()];
  };
  std::vector<MPI_Request> reqs;
  for (const auto& [proc, ranks] : by_proc_) {
    if (proc == w_->proc) continue;
    reqs.push_back(isend(d.send, d.count, d.dtype, receiver_in(proc, rank_), kGather, d));
    for (int g : ranks)
      if (receiver_in(w_->proc, g) == rank_)
        reqs.push_back(irecv(out + g * bytes, d.count, d.dtype, g, kGather, d));
  }
  wait_all(reqs, deadline, d, "the ranks of the other processes to exchange blocks");
  local_phase(phase(kBlocks), d, deadline, "to receive their blocks");
  for (int g = 0; g < size(); ++g) {
    const void* from =
        is_local(g)
            ? slot(g).send
            : static_cast<const unsigned char*>(slot(receiver_in(w_->proc, g)).recv) + g * bytes;
    if (bytes && from != out + g * bytes) std::memcpy(out + g * bytes, from, bytes);
  }
}

// The root sends to the first rank of every other process; the others copy from the root or from
// that rank.
void HierCommunicator::broadcast(const OpDesc& d, Clock::time_point deadline) {
  const size_t bytes = d.count * dtype_size(d.dtype);
  const int root = d.root;
  std::vector<MPI_Request> reqs;
  if (rank_ == root) {
    for (const auto& [proc, ranks] : by_proc_)
      if (proc != w_->proc)
        reqs.push_back(isend(d.recv, d.count, d.dtype, ranks[0], kBroadcast, d));
  } else if (!is_local(root) && local_[0] == rank_) {
    reqs.push_back(irecv(d.recv, d.count, d.dtype, root, kBroadcast, d));
  }
  wait_all(reqs, deadline, d, detail::concat(peer(root), " (the root) to send"));
  local_phase(phase(kBlocks), d, deadline, "to receive the root's buffer");
  const int from = is_local(root) ? root : local_[0];
  if (from != rank_ && bytes) std::memcpy(d.recv, slot(from).recv, bytes);
}

// Blocks between ranks in this process are copied by their receiver; the others travel as
// messages, all posted at once.
void HierCommunicator::all_to_allv(const OpDesc& d, Clock::time_point deadline) {
  const int n = size();
  const size_t es = dtype_size(d.dtype);
  const bool equal = d.type == OpType::AllToAll;
  auto count = [&](const size_t* counts, int g) { return equal ? d.count : counts[g]; };
  auto offset = [&](const size_t* counts, int g) {
    if (equal) return d.count * static_cast<size_t>(g);
    size_t o = 0;
    for (int x = 0; x < g; ++x) o += counts[x];
    return o;
  };
  const auto* my_send = static_cast<const unsigned char*>(slot(rank_).send);
  const size_t* sc = d.send_counts.data();
  const size_t* rc = d.recv_counts.data();
  auto* out = static_cast<unsigned char*>(d.recv);
  std::vector<MPI_Request> reqs;
  std::vector<std::pair<int, size_t>> remote_recvs;  // (rank, index into reqs)
  for (int g = 0; g < n; ++g) {
    if (is_local(g)) continue;
    reqs.push_back(isend(my_send + offset(sc, g) * es, count(sc, g), d.dtype, g, kAllToAll, d));
    remote_recvs.emplace_back(g, reqs.size());
    reqs.push_back(irecv(out + offset(rc, g) * es, count(rc, g), d.dtype, g, kAllToAll, d));
  }
  for (int g : local_) {
    const LocalShared::Slot& p = slot(g);
    const size_t want = count(rc, g), has = count(p.send_counts, rank_);
    if (want != has)
      throw MismatchError(detail::concat(where(d), ": rank ", g, " sends ", has,
                                         " elements to this rank, which expects ", want));
    if (want)
      std::memcpy(out + offset(rc, g) * es,
                  static_cast<const unsigned char*>(p.send) + offset(p.send_counts, rank_) * es,
                  want * es);
  }
  std::vector<MPI_Status> st(reqs.size());
  wait_all(reqs, deadline, d, "the ranks of the other processes to exchange blocks", st.data());
  for (const auto& [g, i] : remote_recvs) {
    int got = 0;
    MPI_Get_count(&st[i], rt::datatype(d.dtype), &got);
    if (static_cast<size_t>(got) != count(rc, g))
      throw MismatchError(detail::concat(where(d), ": ", peer(g), " sent ", got,
                                         " elements to this rank, which expects ", count(rc, g)));
  }
}

void HierCommunicator::send(const OpDesc& d) {
  if (d.tag > kMaxUserTag)
    throw CommUsageError(detail::concat(where(d), ": tag ", d.tag, " above ", kMaxUserTag,
                                        ", the largest this backend carries"));
  const size_t bytes = d.count * dtype_size(d.dtype);
  if (is_local(d.peer)) {
    LocalShared::Message msg{d.dtype, d.count, std::vector<unsigned char>(bytes)};
    if (bytes) std::memcpy(msg.data.data(), d.send, bytes);
    std::lock_guard lk(L_->mu);
    L_->mail[{rank_, d.peer, d.tag}].push_back(std::move(msg));
    L_->cv.notify_all();
    return;
  }
  PendingSend p;
  p.data.resize(bytes);
  if (bytes) std::memcpy(p.data.data(), d.send, bytes);
  p.req = isend(p.data.data(), d.count, d.dtype, d.peer, kUserTags + d.tag, d);
  pending_.push_back(std::move(p));
}

void HierCommunicator::recv(const OpDesc& d, void* buf, size_t count, int from, int tag,
                            Clock::time_point deadline) {
  if (tag > kMaxUserTag)
    throw CommUsageError(detail::concat(where(d), ": tag ", tag, " above ", kMaxUserTag,
                                        ", the largest this backend carries"));
  const size_t es = dtype_size(d.dtype);
  const std::string waiting = detail::concat(peer(from), " to send");
  if (is_local(from)) {
    std::unique_lock lk(L_->mu);
    auto& q = L_->mail[{from, rank_, tag}];
    wait_local(
        lk, d, deadline, [&] { return !q.empty(); }, [&] { return waiting; });
    LocalShared::Message msg = std::move(q.front());
    q.pop_front();
    if (msg.dtype != d.dtype || msg.count != count)
      throw MismatchError(detail::concat(where(d), ": ", peer(from), " sent ",
                                         dtype_name(msg.dtype), " x ", msg.count, ", expected ",
                                         dtype_name(d.dtype), " x ", count));
    if (count) std::memcpy(buf, msg.data.data(), count * es);
    return;
  }
  // Receives up to one element more than expected, so that a longer message is an error here
  // rather than a truncation.
  RequestBuffers keep(abandoned_, scratch_);
  unsigned char* landing = keep.add((count + 1) * es);
  MPI_Request r = irecv(landing, count + 1, d.dtype, from, kUserTags + tag, d);
  MPI_Status st;
  wait_all({&r, 1}, deadline, d, waiting, &st);
  int got = 0;
  MPI_Get_count(&st, rt::datatype(d.dtype), &got);
  if (static_cast<size_t>(got) != count)
    throw MismatchError(detail::concat(where(d), ": ", peer(from), " sent ",
                                       got > static_cast<int>(count) ? "more than " : "", got,
                                       " elements, expected ", count));
  if (count) std::memcpy(buf, landing, count * es);
}

std::unique_ptr<Communicator> HierCommunicator::do_split(int color, int key,
                                                         const std::string& child_name,
                                                         Timeout timeout) {
  const int n = size();
  int64_t mine[3] = {color, key, w_->next_id[thread_].load()};
  std::vector<int64_t> all(3 * static_cast<size_t>(n));
  OpDesc d;
  d.type = OpType::AllGather;
  d.send = mine;
  d.recv = all.data();
  d.count = 3;
  d.dtype = DType::I64;
  d.timeout = timeout;
  d.seq = seq_issued();
  collective(d);
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> members;  // (key, rank here)
  int64_t id = 0;
  for (int g = 0; g < n; ++g)
    if (all[3 * g] == color) {
      members.emplace_back(all[3 * g + 1], g);
      id = std::max(id, all[3 * g + 2]);
    }
  std::sort(members.begin(), members.end());
  if (id >= (int64_t{1} << kIdBits))
    throw CommError(detail::concat("split of communicator '", name(), "': more than ",
                                   (1 << kIdBits) - 1,
                                   " communicators on one rank, the most this backend numbers"));
  w_->next_id[thread_].store(static_cast<int>(id) + 1);
  std::vector<int> ranks;
  int child_rank = 0;
  for (const auto& [k, g] : members) {
    if (g == rank_) child_rank = static_cast<int>(ranks.size());
    ranks.push_back(world_ranks_[g]);
  }
  CommOptions o = options();
  o.name = child_name;
  return std::make_unique<HierCommunicator>(w_, thread_, std::move(ranks), child_rank,
                                            static_cast<int>(id), std::move(o));
}

}  // namespace

std::shared_ptr<HierWorld> make_hier_world(int ranks_per_process, const CommOptions& opts) {
  if (ranks_per_process < 1)
    throw ConfigError(
        detail::concat("ranks per process must be at least 1, not ", ranks_per_process));
  rt::ensure_initialised();
  auto w = std::make_shared<HierWorld>();
  MPI_Comm_size(MPI_COMM_WORLD, &w->procs);
  MPI_Comm_rank(MPI_COMM_WORLD, &w->proc);
  w->threads = ranks_per_process;
  w->opts = opts;
  w->next_id = std::make_unique<std::atomic<int>[]>(ranks_per_process);
  for (int t = 0; t < ranks_per_process; ++t) w->next_id[t].store(1);
  int* ub = nullptr;
  int has = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &has);
  if (!has || *ub < (1 << (kIdBits + kStreamBits)) - 1)
    throw CommError(detail::concat("the MPI library's largest tag (", has ? *ub : 0,
                                   ") is below the ", (1 << (kIdBits + kStreamBits)) - 1,
                                   " the hierarchical backend needs"));
  // Blocking collectives with no deadline of their own (a process that left would hang them).
  const detail::Watchdog watchdog(opts.timeout, [&] {
    return detail::concat("creating the hierarchical backend's world: timed out after ",
                          opts.timeout.count(),
                          " ms in MPI_Allgather / MPI_Comm_dup (a process "
                          "has left)");
  });
  {  // the host of every process, for the segment sizes
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::vector<char> all(static_cast<size_t>(w->procs) * MPI_MAX_PROCESSOR_NAME);
    rt::check(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                            MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD),
              "gathering the hosts of the hierarchical backend's processes");
    std::map<std::string, int> index;
    for (int p = 0; p < w->procs; ++p) {
      const std::string host(all.data() + static_cast<size_t>(p) * MPI_MAX_PROCESSOR_NAME);
      w->host_of_proc.push_back(index.emplace(host, static_cast<int>(index.size())).first->second);
    }
  }
  rt::count_machine_processes(MPI_COMM_WORLD);
  w->oversubscribed = rt::oversubscribed(ranks_per_process);
  w->lanes.resize(static_cast<size_t>(ranks_per_process) * ranks_per_process, MPI_COMM_NULL);
  for (MPI_Comm& c : w->lanes) {
    rt::check(MPI_Comm_dup(MPI_COMM_WORLD, &c),
              "creating the hierarchical backend's communicators");
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  }
  return w;
}

std::unique_ptr<Communicator> hier_communicator(const std::shared_ptr<HierWorld>& w, int thread) {
  std::vector<int> ranks(static_cast<size_t>(w->procs) * w->threads);
  std::iota(ranks.begin(), ranks.end(), 0);
  CommOptions o = w->opts;
  return std::make_unique<HierCommunicator>(w, thread, std::move(ranks),
                                            w->proc * w->threads + thread, 0, std::move(o));
}

void hier_fail(HierWorld& w, const std::string& reason) {
  w.poison(reason);
}

}  // namespace tessera::comm::mpi
