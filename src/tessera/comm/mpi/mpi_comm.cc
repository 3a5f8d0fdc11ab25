#include "tessera/comm/mpi/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "tessera/comm/mpi/runtime.h"
#include "tessera/comm/reduce.h"
#include "tessera/comm/watchdog.h"

namespace tessera::comm::mpi {
namespace {

using detail::OpDesc;
using detail::OpType;
using detail::Watchdog;
using Clock = std::chrono::steady_clock;

void check_mpi(int rc, const std::string& where) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CommError(where + ": MPI error: " + std::string(msg, len));
}

// The prefix of the error messages about one operation (detail::op_context), formatted only when
// an error needs it: it would cost more than a small message's whole transfer.
class Where {
 public:
  Where(const Communicator& c, const OpDesc& d) : c_(&c), d_(&d) {}
  std::string str() const { return detail::op_context(*d_, c_->name(), c_->rank(), c_->size()); }

 private:
  const Communicator* c_;
  const OpDesc* d_;
};

void check_mpi(int rc, const Where& where) {
  if (rc != MPI_SUCCESS) check_mpi(rc, where.str());
}

// bf16 reductions: MPI has no bf16 type, so bf16 travels as MPI_UINT16_T with user-defined ops.
template <ReduceOp Op>
void bf16_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {inout, in};
  detail::reduce_n(inout, srcs, 2, static_cast<size_t>(*len), DType::BF16, Op, 0);
}

// Processes of this job on this machine, counted at the world's creation
// (runtime_access::count_machine_processes); 0 until then.
std::atomic<int> counted_machine_processes{0};

// What tells machines apart: the kernel's boot id, which network and UTS namespaces share (the
// test cluster's hosts are one machine, their processes share its cores), else the host name.
std::string machine_key() {
  std::string key;
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char id[64] = {};
    if (std::fgets(id, sizeof id, f)) key = std::string("boot:") + id;
    std::fclose(f);
  }
  if (key.empty()) {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    key = std::string("host:") + name;
  }
  return key;
}

// MPI is initialised once per process (MPI_THREAD_MULTIPLE) and finalised at exit.
struct Runtime {
  bool we_initialised = false;
  // More ranks on this machine than hardware threads: a waiting rank needs to give its core to
  // the peer it waits for (Open MPI's own rule for mpi_yield_when_idle).
  std::atomic<bool> oversubscribed{false};
  MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL, bf16_min = MPI_OP_NULL;
  Runtime() {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                "MPI_Init_thread");
      we_initialised = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE)
      throw CommError(
          "the MPI library does not provide MPI_THREAD_MULTIPLE, which the tessera MPI backend "
          "requires (its communicators progress asynchronous calls on their own threads)");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    oversubscribed = runtime_access::oversubscribed(1);  // until the world counts the processes
    MPI_Op_create(&bf16_op<ReduceOp::Sum>, 1, &bf16_sum);
    MPI_Op_create(&bf16_op<ReduceOp::Max>, 1, &bf16_max);
    MPI_Op_create(&bf16_op<ReduceOp::Min>, 1, &bf16_min);
  }
  ~Runtime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Op_free(&bf16_sum);
    MPI_Op_free(&bf16_max);
    MPI_Op_free(&bf16_min);
    if (we_initialised) MPI_Finalize();
  }
};

Runtime& runtime() {
  static Runtime rt;
  return rt;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::BF16:
    case DType::F16:
    case DType::U16:
      return MPI_UINT16_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::BF16) {
    Runtime& rt = runtime();
    return op == ReduceOp::Max ? rt.bf16_max : op == ReduceOp::Min ? rt.bf16_min : rt.bf16_sum;
  }
  return op == ReduceOp::Max ? MPI_MAX : op == ReduceOp::Min ? MPI_MIN : MPI_SUM;
}

// All-reduces of [kRingMinBytes, kRingMaxBytes) use ring_all_reduce, in segments of
// CommOptions::ring_segment_bytes; the others MPI_Iallreduce. docs/COMM.md ("MPI all-reduce of
// 64 KiB to 64 MiB") says why, and docs/PERFORMANCE.md ("Collectives") has the measurements.
constexpr size_t kRingMinBytes = 64 * 1024;
constexpr size_t kRingMaxBytes = 64 * 1024 * 1024;

int to_int(size_t v, const Where& where) {
  if (v > static_cast<size_t>(INT_MAX))
    throw CommUsageError(where.str() + ": more than INT_MAX elements in one MPI call");
  return static_cast<int>(v);
}

// How long a wait polls without yielding its core, unless the machine is oversubscribed. A
// yield hands the core to any other runnable process for the rest of its time slice (about 3 ms
// here): with a busy process sharing a core, waits that yielded after 256 tests, as this loop
// once did, made many 2 MiB all_to_allv iterations of 0.36 ms take 3.2 ms, while raw MPI, which
// polls without yielding, kept its core (docs/PERFORMANCE.md, "all_to_allv of the MPI backend").
// A wait longer than this is waiting for a peer that is not running, and then yielding helps: in
// one run with a busy process on each core raw MPI_Alltoallv took 16 ms where the yielding
// backend took 4-8.
constexpr auto kSpinBeforeYield = std::chrono::milliseconds(1);

// The polling loop of the MPI backend, the only one: calls `test()`, which tests pending requests
// (MPI progresses them inside the test) and returns true once the wait is over, until it does
// (true) or `deadline` has passed (false). It looks at the clock every 256 tests; from
// kSpinBeforeYield into the wait on (at once on an oversubscribed machine) it yields the core
// then. The bounded cleanup waits (unreceived sends at destruction, a cancelled receive) use it
// directly; every wait that fails at its deadline goes through wait_until.
template <typename Test>
bool poll_until(Clock::time_point deadline, Test&& test) {
  if (test()) return true;
  const auto yield_from = runtime().oversubscribed.load(std::memory_order_relaxed)
                              ? Clock::time_point::min()
                              : Clock::now() + kSpinBeforeYield;
  for (long iter = 1;; ++iter) {
    if (test()) return true;
    if ((iter & 255) == 255) {
      const auto now = Clock::now();
      if (now >= deadline) return false;
      if (now >= yield_from) std::this_thread::yield();
    }
  }
}

// Set once any call of this process has timed out. The process is then on its way out with an
// error, and a communicator's destructor no longer gives its unreceived sends a timeout of their
// own: with sends pending on several communicators towards a peer behind a cut link, those waits
// would add up to many timeouts before the error reaches the user.
std::atomic<bool> a_call_timed_out{false};

// The wait-until-or-fail of the MPI backend: poll_until(deadline, test), and when the deadline
// has passed, `give_up()`, which cancels or abandons what is still pending and returns what the
// op was waiting for ("rank 1 to send"); then throws TimeoutError "<where>: timed out after
// <timeout> ms waiting for <that>".
template <typename Test, typename GiveUp>
void wait_until(const Where& where, Timeout timeout, Clock::time_point deadline, Test&& test,
                GiveUp&& give_up) {
  if (poll_until(deadline, test)) return;
  a_call_timed_out.store(true, std::memory_order_relaxed);
  const std::string waiting_for = give_up();
  throw TimeoutError(detail::concat(where.str(), ": timed out after ", timeout.count(),
                                    " ms waiting for ", waiting_for));
}

// Scratch buffers that MPI requests of one call read or write. A request abandoned after a
// timeout (MPI cannot take every posted request back) may still use its buffer later, so when the
// communicator has abandoned a request by the end of the call the buffers are leaked with it
// rather than freed (moving a vector keeps its storage where it is).
template <typename... Buffers>
class KeepIfAbandoned {
 public:
  KeepIfAbandoned(const bool& abandoned, Buffers&... buffers)
      : abandoned_(abandoned), buffers_(buffers...) {}
  KeepIfAbandoned(const KeepIfAbandoned&) = delete;
  KeepIfAbandoned& operator=(const KeepIfAbandoned&) = delete;
  ~KeepIfAbandoned() {
    if (abandoned_)
      std::apply([](auto&... b) { ((void)new auto(std::move(b)), ...); }, buffers_);  // NOLINT
  }

 private:
  const bool& abandoned_;
  std::tuple<Buffers&...> buffers_;
};

// The host of every world rank (MPI_Get_processor_name), gathered once when the world
// communicator is made, so that an error about a peer can say where that peer runs: on a job that
// spans hosts, "rank 1 (world rank 3 on host h2)". A job on one host keeps the shorter messages.
struct Hosts {
  std::vector<std::string> of_world_rank;
  bool several = false;  // more than one distinct host
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, CommOptions opts, std::shared_ptr<const Hosts> hosts)
      : Communicator(std::move(opts)), comm_(comm), hosts_(std::move(hosts)) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    world_of_ = world_ranks(comm_, size_);
    // Blocking collectives with no deadline of their own (a rank that left would hang them).
    const Watchdog watchdog(options().timeout, [this] {
      return "creating communicator '" + name() + "' rank " + std::to_string(rank_) + "/" +
             std::to_string(size_) + ": timed out after " +
             std::to_string(options().timeout.count()) + " ms in MPI_Comm_dup (a rank has left)";
    });
    check_mpi(MPI_Comm_dup(comm_, &control_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_dup(comm_, &data_), "MPI_Comm_dup");
  }
  ~MpiCommunicator() override {
    stop_progress_thread();
    // Unreceived eager sends: give the receivers the communicator's timeout, then abandon them
    // (Open MPI cannot cancel a send, and waiting for a cancelled one blocks forever when the
    // receiver is gone). An abandoned send keeps its buffer: it is leaked with the communicator.
    const auto until =
        Clock::now() +
        (a_call_timed_out.load(std::memory_order_relaxed) ? Timeout{0} : options().timeout);
    for (auto& p : pending_) {
      int done = 0;
      poll_until(until, [&] {
        MPI_Test(&p.req, &done, MPI_STATUS_IGNORE);
        return done != 0;
      });
      if (!done) {
        abandoned_ = true;
        (void)new PendingSend(std::move(p));  // NOLINT: owned by MPI from now on
      }
    }
    // Requests abandoned after a timeout may still be in flight: leak rather than free.
    if (abandoned_) return;
    MPI_Comm_free(&control_);
    MPI_Comm_free(&data_);
    MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  int world_rank() const override { return world_rank_; }

 protected:
  void execute(const OpDesc& d) override;
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& child_name,
                                         Timeout timeout) override;
  // An injected exit ends the process as a crash would: no destructors, no MPI_Finalize.
  [[noreturn]] void exit_rank(const std::string& why, int status) override {
    exit_process(why, status);
  }

 private:
  // Polls `reqs` until all complete or the deadline passes. On timeout, cancels what MPI allows
  // (point to point) and throws TimeoutError naming `waiting_for` (empty: others()).
  void wait_all(std::span<MPI_Request> reqs, Clock::time_point deadline, const OpDesc& d,
                std::string_view waiting_for = {}, bool cancellable = false);
  void exchange_fingerprints(const OpDesc& d, Clock::time_point deadline);
  void ring_all_reduce(const OpDesc& d, Clock::time_point deadline);
  void all_to_allv(const OpDesc& d, Clock::time_point deadline, const Where& w);
  void send_recv(const OpDesc& d, Clock::time_point deadline, const Where& w);
  // A receive from `peer` completed with MPI return code `rc` and status `st`: throws
  // MismatchError when the message did not have `count` elements (or did not fit).
  void check_received(int rc, const MPI_Status& st, const OpDesc& d, int peer, size_t count,
                      const Where& w) const;
  // After a timeout: cancels a pending receive, waiting for the cancellation until `until` (one
  // budget for all the requests of a call, cancel_budget(), so that the error is not delayed by a
  // second per request); a receive not cancelled by then, or a send (Open MPI cannot cancel
  // sends), is abandoned.
  void cancel_or_abandon(MPI_Request& req, bool is_send, Clock::time_point until);
  static Clock::time_point cancel_budget() { return Clock::now() + std::chrono::seconds(1); }
  // Peers as the errors name them: "rank 1", or on a job that spans hosts "rank 1 (world rank 3
  // on host h2)"; peer_list({1, 2}): "1,2", or "1 (world rank 3 on host h2), 2 (...)".
  std::string peer(int r) const;
  std::string peer_list(const std::vector<int>& ranks) const;
  // Whom a collective that timed out was waiting for, when MPI does not say which peer was
  // missing: the other ranks; on a job across hosts, the other rank of a pair by name, or the
  // hosts the group's ranks run on.
  std::string others() const;
  // The world rank of each rank of `comm` (of `size` ranks).
  static std::vector<int> world_ranks(MPI_Comm comm, int size);

  // Sends are eager, as on the inproc backend: the data is copied and the call completes at once;
  // the requests finish in the background (progressed by later MPI calls) and are reaped here.
  struct PendingSend {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<unsigned char> data;
    std::string what;
  };
  void reap_sends(const OpDesc* d);
  std::deque<PendingSend> pending_;

  MPI_Comm comm_;
  MPI_Comm control_;  // fingerprints (debug mode)
  // The messages of the collectives this backend runs itself over point to point (ring_all_reduce,
  // all_to_allv), never mixed with user send/recv.
  MPI_Comm data_;
  std::shared_ptr<const Hosts> hosts_;
  std::vector<int> world_of_;  // the world rank of each rank of this communicator
  int rank_ = 0, size_ = 1, world_rank_ = 0;
  bool abandoned_ = false;
};

void MpiCommunicator::wait_all(std::span<MPI_Request> reqs, Clock::time_point deadline,
                               const OpDesc& d, std::string_view waiting_for, bool cancellable) {
  const Where w(*this, d);
  wait_until(
      w, d.timeout, deadline,
      [&] {
        int flag = 0;
        check_mpi(
            MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), w);
        return flag != 0;
      },
      [&] {
        if (cancellable) {  // bounded: a send cannot be cancelled, and MPI_Wait on it could block
          const auto until = cancel_budget();
          for (auto& r : reqs) cancel_or_abandon(r, false, until);
        } else {
          abandoned_ = true;
        }
        return waiting_for.empty() ? others() : std::string(waiting_for);
      });
}

std::vector<int> MpiCommunicator::world_ranks(MPI_Comm comm, int size) {
  std::vector<int> mine(size), world(size);
  for (int r = 0; r < size; ++r) mine[r] = r;
  MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_translate_ranks(g, size, mine.data(), wg, world.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return world;
}

std::string MpiCommunicator::peer(int r) const {
  std::string s = detail::concat("rank ", r);
  if (!hosts_->several || r < 0 || r >= size_) return s;
  const int w = world_of_[r];
  return detail::concat(s, " (world rank ", w, " on host ", hosts_->of_world_rank[w], ")");
}

std::string MpiCommunicator::peer_list(const std::vector<int>& ranks) const {
  std::string s;
  for (const int r : ranks) {
    if (!s.empty()) s += hosts_->several ? ", " : ",";
    s += peer(r).substr(5);  // without "rank "
  }
  return s;
}

std::string MpiCommunicator::others() const {
  constexpr std::string_view plain = "the other ranks (set TESSERA_COMM_DEBUG=1 to learn which)";
  if (!hosts_->several) return std::string(plain);
  if (size_ == 2) return peer(1 - rank_);
  // Hosts in order of first appearance, with their ranks of this communicator.
  std::vector<std::pair<std::string, std::string>> by_host;
  for (int r = 0; r < size_; ++r) {
    const std::string& h = hosts_->of_world_rank[world_of_[r]];
    auto it = std::find_if(by_host.begin(), by_host.end(), [&](auto& e) { return e.first == h; });
    if (it == by_host.end()) it = by_host.insert(by_host.end(), {h, ""});
    if (!it->second.empty()) it->second += ',';
    it->second += std::to_string(r);
  }
  std::string where;
  constexpr size_t kMaxHosts = 8;
  for (size_t i = 0; i < by_host.size() && i < kMaxHosts; ++i)
    where += detail::concat(i ? ", " : "", by_host[i].first, " (rank(s) ", by_host[i].second, ")");
  if (by_host.size() > kMaxHosts)
    where += detail::concat(" and ", by_host.size() - kMaxHosts, " more");
  return detail::concat("the other ranks (set TESSERA_COMM_DEBUG=1 to learn which; the ranks of '",
                        name(), "' run on host(s) ", where, ")");
}

// Large all-reduces run as a ring over point-to-point messages: ReduceScatter (n-1 steps: send
// chunk r-k to the right neighbour, receive chunk r-k-1 from the left one and add it in), then
// AllGather (n-1 steps: pass the finished chunks on). Each chunk travels in segments, all posted
// at once, and a received segment is reduced while the next ones are still arriving. Open MPI
// serves MPI_Iallreduce (which a deadline needs: a blocking call cannot time out) with its
// nonblocking-collective algorithms, which are slower than blocking MPI_Allreduce at these sizes;
// this keeps the deadline, overlaps transfer with the reduction and reads the input in place (no
// copy into the output first). The measurements against blocking MPI_Allreduce are in
// docs/PERFORMANCE.md ("Collectives"), and docs/COMM.md explains the size range.
void MpiCommunicator::ring_all_reduce(const OpDesc& d, Clock::time_point deadline) {
  const size_t es = dtype_size(d.dtype);
  const std::string w = where(d);
  // Out of place, the input is read where it is (no copy into the output first): chunk c of the
  // output is first written by the reduction that receives c, or by the AllGather.
  auto* out = static_cast<unsigned char*>(d.recv);
  const auto* in = static_cast<const unsigned char*>(d.send);
  const int n = size_, r = rank_, right = (r + 1) % n, left = (r + n - 1) % n;
  auto begin = [&](int c) { return d.count * static_cast<size_t>(c) / static_cast<size_t>(n); };
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  // Segments of ring_segment_bytes (whole elements, at least one). Every element is reduced once
  // per step, in the same order whatever the segment size: the bits depend on the rank count only.
  const size_t seg = std::max<size_t>(1, options().ring_segment_bytes / es);
  const MPI_Datatype type = mpi_type(d.dtype);
  const ReduceOp op = d.op == ReduceOp::Mean ? ReduceOp::Sum : d.op;
  std::vector<unsigned char> tmp((d.count / n + 1) * es);
  const KeepIfAbandoned keep(abandoned_, tmp);
  // Posted ring messages cannot be taken back: a timeout abandons them.
  const std::string neighbours =
      left == right ? detail::concat("ring neighbour ", peer(left))
                    : detail::concat("ring neighbour ", peer(left), " or ", peer(right));
  auto wait_one = [&](MPI_Request& req) { wait_all({&req, 1}, deadline, d, neighbours); };
  std::vector<MPI_Request> sends, recvs;
  for (int step = 0; step < 2 * (n - 1); ++step) {
    const bool reducing = step < n - 1;
    const int k = reducing ? step : step - (n - 1);
    const int send_c = reducing ? mod(r - k) : mod(r + 1 - k);
    const int recv_c = reducing ? mod(r - k - 1) : mod(r - k);
    const size_t sb = begin(send_c), sl = begin(send_c + 1) - sb;
    const size_t rb = begin(recv_c), rl = begin(recv_c + 1) - rb;
    unsigned char* landing = reducing ? tmp.data() : out + rb * es;
    sends.clear();
    recvs.clear();
    for (size_t a = 0; a < rl; a += seg) {
      recvs.emplace_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Irecv(landing + a * es, static_cast<int>(std::min(seg, rl - a)), type, left,
                          step, data_, &recvs.back()),
                w);
    }
    // Step 0 sends this rank's own input chunk; every later step a chunk it reduced or received.
    const unsigned char* send_from = step == 0 ? in : out;
    for (size_t a = 0; a < sl; a += seg) {
      sends.emplace_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Isend(send_from + (sb + a) * es, static_cast<int>(std::min(seg, sl - a)), type,
                          right, step, data_, &sends.back()),
                w);
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      wait_one(recvs[i]);
      if (!reducing) continue;
      const size_t a = i * seg, m = std::min(seg, rl - a);
      unsigned char* dst = out + (rb + a) * es;
      // Adds this rank's own input for the chunk to the partial sum that arrived.
      const void* mine = in + (rb + a) * es;
      const void* srcs[2] = {mine, tmp.data() + a * es};
      detail::reduce_n(dst, srcs, 2, m, d.dtype, op, 0);
    }
    for (MPI_Request& s : sends) wait_one(s);
  }
}

// all_to_allv in one round of point-to-point messages on data_: to every other rank this rank
// sends its counts (its send_counts and recv_counts, 2n numbers) and its block, and from every
// other rank it receives the same, all posted at once; its own block is copied. Every rank then
// holds every rank's counts and checks every pair, so a mismatch fails on every rank with the
// same MismatchError. A block sent with another count than its receiver expects cannot overrun
// the receive buffer: MPI truncates it (an error on that receive, which the check explains) or
// delivers fewer elements; the receive buffer may then have been partly written.
//
// It replaced MPI_Ialltoall of the counts, MPI_Iallreduce of a mismatch flag and MPI_Ialltoallv:
// three rounds, each of which waits for the slowest rank (docs/PERFORMANCE.md, "all_to_allv of
// the MPI backend").
void MpiCommunicator::all_to_allv(const OpDesc& d, Clock::time_point deadline, const Where& w) {
  constexpr int kCountsTag = 30000, kBlocksTag = 30001;  // ring_all_reduce's tags are its steps
  const int n = size_, me = rank_;
  const size_t es = dtype_size(d.dtype);
  const MPI_Datatype type = mpi_type(d.dtype);
  // counts[p * 2n + j]: rank p's send_counts[j]; counts[p * 2n + n + j]: its recv_counts[j].
  std::vector<int64_t> counts(2 * static_cast<size_t>(n) * n);
  std::vector<unsigned char> copy;  // in place: the input, before the blocks overwrite it
  const KeepIfAbandoned keep(abandoned_, counts, copy);
  int64_t* mine = &counts[2 * static_cast<size_t>(n) * me];
  size_t send_total = 0, recv_total = 0;
  std::vector<size_t> send_at(n), recv_at(n);  // block offsets, in elements
  for (int p = 0; p < n; ++p) {
    to_int(d.send_counts[p], w);  // every block is one MPI message
    to_int(d.recv_counts[p], w);
    mine[p] = static_cast<int64_t>(d.send_counts[p]);
    mine[n + p] = static_cast<int64_t>(d.recv_counts[p]);
    send_at[p] = send_total;
    recv_at[p] = recv_total;
    send_total += d.send_counts[p];
    recv_total += d.recv_counts[p];
  }
  const auto* in = static_cast<const unsigned char*>(d.send);
  auto* out = static_cast<unsigned char*>(d.recv);
  if (d.send == d.recv && send_total) {
    copy.assign(in, in + send_total * es);
    in = copy.data();
  }
  // Receives first: [0, n-1) counts, [n-1, 2n-2) blocks; then sends: counts, blocks.
  const int m = n - 1;
  std::vector<MPI_Request> reqs(4 * static_cast<size_t>(m), MPI_REQUEST_NULL);
  std::vector<MPI_Status> st(reqs.size());
  auto other = [&](int k) { return k < me ? k : k + 1; };  // the k-th other rank
  for (int k = 0; k < m; ++k) {
    const int p = other(k);
    check_mpi(MPI_Irecv(&counts[2 * static_cast<size_t>(n) * p], 2 * n, MPI_INT64_T, p, kCountsTag,
                        data_, &reqs[k]),
              w);
    check_mpi(MPI_Irecv(out + recv_at[p] * es, static_cast<int>(d.recv_counts[p]), type, p,
                        kBlocksTag, data_, &reqs[m + k]),
              w);
  }
  for (int k = 0; k < m; ++k) {
    const int p = other(k);
    check_mpi(MPI_Isend(mine, 2 * n, MPI_INT64_T, p, kCountsTag, data_, &reqs[2 * m + k]), w);
    check_mpi(MPI_Isend(in + send_at[p] * es, static_cast<int>(d.send_counts[p]), type, p,
                        kBlocksTag, data_, &reqs[3 * m + k]),
              w);
  }
  // Its own block, while the messages travel (a mismatch with itself is found with the others).
  if (d.send_counts[me] == d.recv_counts[me] && d.send_counts[me])
    std::memcpy(out + recv_at[me] * es, in + send_at[me] * es, d.send_counts[me] * es);
  bool truncated = false;  // a block receive failed: MPI_ERR_TRUNCATE, explained by the counts
  wait_until(
      w, d.timeout, deadline,
      [&] {
        int flag = 0;
        const int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, st.data());
        if (rc == MPI_SUCCESS) return flag != 0;
        if (rc != MPI_ERR_IN_STATUS || !flag) {  // not all complete: some may still be in flight
          abandoned_ = true;
          check_mpi(rc, w);
        }
        // All completed, some in error: a truncated block is a count mismatch; others are not.
        for (size_t i = 0; i < reqs.size(); ++i) {
          const int e = st[i].MPI_ERROR;
          if (e == MPI_SUCCESS) continue;
          int cls = 0;
          MPI_Error_class(e, &cls);
          if (cls == MPI_ERR_TRUNCATE && i >= static_cast<size_t>(m) &&
              i < 2 * static_cast<size_t>(m))
            truncated = true;
          else
            check_mpi(e, w);
        }
        return true;
      },
      [&] {
        for (MPI_Request& r : reqs) {  // MPI_Testall left the ones that completed pending
          int done = 0;
          if (r != MPI_REQUEST_NULL && MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            r = MPI_REQUEST_NULL;  // completed in error (freed)
        }
        std::vector<int> recv_from, send_to;
        for (int k = 0; k < m; ++k) {
          const int p = other(k);
          if (reqs[k] != MPI_REQUEST_NULL || reqs[m + k] != MPI_REQUEST_NULL)
            recv_from.push_back(p);
          if (reqs[2 * m + k] != MPI_REQUEST_NULL || reqs[3 * m + k] != MPI_REQUEST_NULL)
            send_to.push_back(p);
        }
        const auto until = cancel_budget();
        for (int i = 0; i < 2 * m; ++i) cancel_or_abandon(reqs[i], false, until);
        for (size_t i = 2 * m; i < reqs.size(); ++i) cancel_or_abandon(reqs[i], true, until);
        std::string missing;
        if (!recv_from.empty())
          missing = detail::concat("rank(s) ", peer_list(recv_from), " to send");
        if (!send_to.empty())
          missing += detail::concat(missing.empty() ? "" : " and for ", "rank(s) ",
                                    peer_list(send_to), " to receive this rank's counts and block");
        return missing;
      });
  // Every pair, on every rank: rank i's send_counts[j] against rank j's recv_counts[i].
  int worst = -1;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < n; ++i)
      if (counts[2 * static_cast<size_t>(n) * i + j] !=
          counts[2 * static_cast<size_t>(n) * j + n + i])
        worst = j;
  if (worst >= 0)
    throw MismatchError(detail::concat(w.str(), ": send and receive counts disagree (rank ", worst,
                                       " expects different counts than its peers send it)"));
  if (truncated)  // not explained by the counts: cannot happen unless MPI misbehaves
    throw CommError(w.str() + ": a block was truncated although every count agrees");
}

void MpiCommunicator::check_received(int rc, const MPI_Status& st, const OpDesc& d, int peer,
                                     size_t count, const Where& w) const {
  if (rc != MPI_SUCCESS) {
    int cls = 0;
    MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_TRUNCATE)
      throw MismatchError(detail::concat(w.str(), ": rank ", peer, " sent more than ", count, " ",
                                         dtype_name(d.dtype),
                                         " elements, which this rank expects"));
    check_mpi(rc, w);
  }
  int got = 0;
  MPI_Get_count(&st, mpi_type(d.dtype), &got);
  if (got == MPI_UNDEFINED || static_cast<size_t>(got) != count)
    throw MismatchError(detail::concat(w.str(), ": rank ", peer, " sent ", got, " ",
                                       dtype_name(d.dtype), " elements, this rank expects ",
                                       count));
}

void MpiCommunicator::cancel_or_abandon(MPI_Request& req, bool is_send, Clock::time_point until) {
  if (req == MPI_REQUEST_NULL) return;
  if (!is_send) {
    MPI_Cancel(&req);
    int done = 0;
    poll_until(until, [&] {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
    if (done) return;
  }
  abandoned_ = true;  // the request may still use the user's buffer: leak the communicators
}

// Posts the receive, then the send (both nonblocking, so pairs and rings of exchanges cannot
// deadlock), and polls both against the deadline. The send goes straight from the user's buffer:
// the call returns when MPI is done with it.
void MpiCommunicator::send_recv(const OpDesc& d, Clock::time_point deadline, const Where& w) {
  if (d.peer == rank_) return exchange_with_self(d);  // validated: recv_peer == rank_ too
  const MPI_Datatype type = mpi_type(d.dtype);
  MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // receive, send
  MPI_Status st;
  if (d.recv_peer >= 0)
    check_mpi(
        MPI_Irecv(d.recv, to_int(d.recv_count, w), type, d.recv_peer, d.recv_tag, comm_, &reqs[0]),
        w);
  if (d.peer >= 0) {
    const int rc = MPI_Isend(d.send, to_int(d.count, w), type, d.peer, d.tag, comm_, &reqs[1]);
    if (rc != MPI_SUCCESS) cancel_or_abandon(reqs[0], false, cancel_budget());
    check_mpi(rc, w);
  }
  std::exception_ptr recv_error;  // a failed receive; the send is still completed first
  wait_until(
      w, d.timeout, deadline,
      [&] {
        int flag = 0;
        if (reqs[0] != MPI_REQUEST_NULL) {
          const int rc = MPI_Test(&reqs[0], &flag, &st);
          if (rc != MPI_SUCCESS || flag) {
            reqs[0] = MPI_REQUEST_NULL;  // completed (an erroneous request is freed too)
            try {
              check_received(rc, st, d, d.recv_peer, d.recv_count, w);
            } catch (...) {
              recv_error = std::current_exception();
            }
          }
        }
        if (reqs[1] != MPI_REQUEST_NULL) check_mpi(MPI_Test(&reqs[1], &flag, MPI_STATUS_IGNORE), w);
        return reqs[0] == MPI_REQUEST_NULL && reqs[1] == MPI_REQUEST_NULL;
      },
      [&] {
        if (recv_error) std::rethrow_exception(recv_error);
        std::string missing;
        if (reqs[0] != MPI_REQUEST_NULL) missing = detail::concat(peer(d.recv_peer), " to send");
        if (reqs[1] != MPI_REQUEST_NULL)
          missing += detail::concat(missing.empty() ? "" : " and for ", peer(d.peer),
                                    " to receive this rank's message");
        const auto until = cancel_budget();
        cancel_or_abandon(reqs[0], false, until);
        cancel_or_abandon(reqs[1], true, until);
        return missing;
      });
  if (recv_error) std::rethrow_exception(recv_error);
}

void MpiCommunicator::exchange_fingerprints(const OpDesc& d, Clock::time_point deadline) {
  const Where w(*this, d);
  std::vector<detail::Fingerprint> all(size_);  // every send reads all[rank_]
  const KeepIfAbandoned keep(abandoned_, all);
  all[rank_] = detail::fingerprint_of(d);
  std::vector<MPI_Request> sends, recvs;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    MPI_Request r;
    check_mpi(MPI_Irecv(&all[p], sizeof(detail::Fingerprint), MPI_BYTE, p, 0, control_, &r), w);
    recvs.push_back(r);
    check_mpi(MPI_Isend(&all[rank_], sizeof(detail::Fingerprint), MPI_BYTE, p, 0, control_, &r), w);
    sends.push_back(r);
  }
  wait_until(
      w, d.timeout, deadline,
      [&] {
        int flag = 0;
        check_mpi(
            MPI_Testall(static_cast<int>(recvs.size()), recvs.data(), &flag, MPI_STATUSES_IGNORE),
            w);
        return flag != 0;
      },
      [&] {
        std::vector<int> missing;
        int k = 0;
        for (int p = 0; p < size_; ++p) {
          if (p == rank_) continue;
          int done = 0;
          if (recvs[k] != MPI_REQUEST_NULL) MPI_Test(&recvs[k], &done, MPI_STATUS_IGNORE);
          if (recvs[k] != MPI_REQUEST_NULL) missing.push_back(p);
          ++k;
        }
        const auto until = cancel_budget();
        for (auto& r : recvs) cancel_or_abandon(r, false, until);
        for (auto& r : sends) cancel_or_abandon(r, true, until);
        return detail::concat("rank(s) ", peer_list(missing), " to reach this collective");
      });
  wait_all(sends, deadline, d, "fingerprint sends", true);
  detail::check_fingerprints(all, name(), rank_);
}

void MpiCommunicator::reap_sends(const OpDesc* d) {
  (void)d;
  while (!pending_.empty()) {
    int done = 0;
    check_mpi(MPI_Test(&pending_.front().req, &done, MPI_STATUS_IGNORE), pending_.front().what);
    if (!done) return;
    pending_.pop_front();
  }
}

void MpiCommunicator::execute(const OpDesc& d) {
  if (!pending_.empty()) reap_sends(&d);
  const auto deadline = Clock::now() + d.timeout;
  if (options().debug && detail::is_collective(d.type)) exchange_fingerprints(d, deadline);
  const Where w(*this, d);
  const int count = to_int(d.count, w);
  const MPI_Datatype type = mpi_type(d.dtype);
  const size_t es = dtype_size(d.dtype);
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  std::vector<unsigned char> tmp;
  const KeepIfAbandoned keep(abandoned_, tmp);
  switch (d.type) {
    case OpType::AllReduce: {
      if (size_ > 1 && d.count * es >= kRingMinBytes && d.count * es < kRingMaxBytes) {
        ring_all_reduce(d, deadline);
        if (d.op == ReduceOp::Mean) detail::divide(d.recv, d.count, d.dtype, size_);
        return;
      }
      const void* in = d.send == d.recv ? MPI_IN_PLACE : d.send;
      check_mpi(MPI_Iallreduce(in, d.recv, count, type, mpi_op(d.op, d.dtype), comm_, &reqs[0]), w);
      wait_all(reqs, deadline, d);
      if (d.op == ReduceOp::Mean) detail::divide(d.recv, d.count, d.dtype, size_);
      return;
    }
    case OpType::AllGather: {
      const void* in = d.send == static_cast<unsigned char*>(d.recv) + rank_ * d.count * es
                           ? MPI_IN_PLACE
                           : d.send;
      check_mpi(MPI_Iallgather(in, count, type, d.recv, count, type, comm_, &reqs[0]), w);
      wait_all(reqs, deadline, d);
      return;
    }
    case OpType::ReduceScatter: {
      // Our in-place convention (recv inside send) differs from MPI's; use a scratch output.
      const bool in_place =
          d.recv == static_cast<const unsigned char*>(d.send) + rank_ * d.count * es;
      void* out = d.recv;
      if (in_place) {
        tmp.resize(d.count * es);
        out = tmp.data();
      }
      check_mpi(MPI_Ireduce_scatter_block(d.send, out, count, type, mpi_op(d.op, d.dtype), comm_,
                                          &reqs[0]),
                w);
      wait_all(reqs, deadline, d);
      if (in_place && d.count) std::memcpy(d.recv, tmp.data(), d.count * es);
      if (d.op == ReduceOp::Mean) detail::divide(d.recv, d.count, d.dtype, size_);
      return;
    }
    case OpType::Broadcast:
      check_mpi(MPI_Ibcast(d.recv, count, type, d.root, comm_, &reqs[0]), w);
      wait_all(reqs, deadline, d, detail::concat("root ", peer(d.root), " or the other ranks"));
      return;
    case OpType::AllToAll: {
      const void* in = d.send;
      if (d.send == d.recv && d.count) {
        tmp.assign(static_cast<const unsigned char*>(d.send),
                   static_cast<const unsigned char*>(d.send) + d.count * es * size_);
        in = tmp.data();
      }
      check_mpi(MPI_Ialltoall(in, count, type, d.recv, count, type, comm_, &reqs[0]), w);
      wait_all(reqs, deadline, d);
      return;
    }
    case OpType::AllToAllV:
      all_to_allv(d, deadline, w);
      return;
    case OpType::Barrier:
      check_mpi(MPI_Ibarrier(comm_, &reqs[0]), w);
      wait_all(reqs, deadline, d);
      return;
    case OpType::Send: {
      PendingSend p;
      p.data.assign(static_cast<const unsigned char*>(d.send),
                    static_cast<const unsigned char*>(d.send) + d.count * es);
      p.what = w.str();
      check_mpi(MPI_Isend(p.data.data(), count, type, d.peer, d.tag, comm_, &p.req), w);
      pending_.push_back(std::move(p));
      reap_sends(&d);
      return;
    }
    case OpType::Recv: {
      MPI_Status st;
      check_mpi(MPI_Irecv(d.recv, count, type, d.peer, d.tag, comm_, &reqs[0]), w);
      wait_until(
          w, d.timeout, deadline,
          [&] {
            int flag = 0;
            const int rc = MPI_Test(&reqs[0], &flag, &st);
            if (rc != MPI_SUCCESS) check_received(rc, st, d, d.peer, d.count, w);
            return flag != 0;
          },
          [&] {
            cancel_or_abandon(reqs[0], false, cancel_budget());
            return detail::concat(peer(d.peer), " to send");
          });
      check_received(MPI_SUCCESS, st, d, d.peer, d.count, w);
      return;
    }
    case OpType::SendRecv:
      send_recv(d, deadline, w);
      return;
    case OpType::Split:
      break;
  }
  throw CommUsageError(w.str() + ": unexpected op");
}

std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key,
                                                        const std::string& child_name,
                                                        Timeout timeout) {
  OpDesc d;
  d.type = OpType::Split;
  d.seq = seq_issued();
  d.timeout = timeout;
  const auto deadline = Clock::now() + timeout;
  // Make sure every rank is here (with a deadline) before the blocking MPI_Comm_split.
  if (options().debug) exchange_fingerprints(d, deadline);
  std::vector<MPI_Request> reqs(1);
  int ck[2] = {color, key};
  std::vector<int> all(2 * size_);
  check_mpi(MPI_Iallgather(ck, 2, MPI_INT, all.data(), 2, MPI_INT, comm_, &reqs[0]), where(d));
  wait_all(reqs, deadline, d);
  // Every rank reached the split, but one may have given up since (its deadline passed after it
  // had posted its part) and left; MPI_Comm_split, which blocks without a deadline, would then
  // wait for it forever. A watchdog ends this process if the split overruns another deadline.
  MPI_Comm out = MPI_COMM_NULL;
  {
    const Watchdog watchdog(timeout, [&] {
      return where(d) + ": timed out after " + std::to_string(timeout.count()) +
             " ms in MPI_Comm_split (every rank had reached the split, so one has left since: it "
             "timed out or failed)";
    });
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out), where(d));
  }
  if (out == MPI_COMM_NULL) return nullptr;
  CommOptions o = options();
  o.name = child_name;
  return std::make_unique<MpiCommunicator>(out, std::move(o), hosts_);
}

}  // namespace

std::unique_ptr<Communicator> make_world(const CommOptions& opts) {
  runtime();
  MPI_Comm c;
  auto hosts = std::make_shared<Hosts>();
  {
    const Timeout timeout = opts.timeout;  // resolved (launch.cc)
    const Watchdog watchdog(timeout, [timeout] {
      return "creating the world communicator: timed out after " + std::to_string(timeout.count()) +
             " ms in MPI_Comm_dup(MPI_COMM_WORLD) or gathering the host names (a process has left "
             "or never started)";
    });
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &c), "MPI_Comm_dup(MPI_COMM_WORLD)");
    // Every rank's host, for the errors that name a peer.
    int size = 1, len = 0;
    MPI_Comm_size(c, &size);
    std::vector<char> name(MPI_MAX_PROCESSOR_NAME, '\0');
    std::vector<char> all(name.size() * static_cast<size_t>(size), '\0');
    check_mpi(MPI_Get_processor_name(name.data(), &len), "MPI_Get_processor_name");
    check_mpi(MPI_Allgather(name.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                            MPI_MAX_PROCESSOR_NAME, MPI_CHAR, c),
              "gathering the host names (MPI_Allgather)");
    for (int r = 0; r < size; ++r) {
      const char* h = all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
      hosts->of_world_rank.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
      hosts->several = hosts->several || hosts->of_world_rank.back() != hosts->of_world_rank[0];
    }
    runtime_access::count_machine_processes(c);
  }
  runtime().oversubscribed = runtime_access::oversubscribed(1);
  return std::make_unique<MpiCommunicator>(c, opts, std::move(hosts));
}

}  // namespace tessera::comm::mpi

namespace tessera::comm::mpi::runtime_access {

void ensure_initialised() {
  (void)runtime();
}

void count_machine_processes(MPI_Comm world) {
  constexpr int kKey = 128;
  std::string key = machine_key();
  key.resize(kKey, '\0');
  int size = 1;
  MPI_Comm_size(world, &size);
  std::vector<char> all(static_cast<size_t>(kKey) * size);
  check_mpi(MPI_Allgather(key.data(), kKey, MPI_CHAR, all.data(), kKey, MPI_CHAR, world),
            "counting the processes on this machine (MPI_Allgather)");
  int n = 0;
  for (int r = 0; r < size; ++r)
    n += std::memcmp(all.data() + static_cast<size_t>(r) * kKey, key.data(), kKey) == 0;
  counted_machine_processes.store(n, std::memory_order_relaxed);
}

int machine_processes() {
  if (const int n = counted_machine_processes.load(std::memory_order_relaxed); n > 0) return n;
  // Before the count: the launcher's node-local size (Open MPI, MPICH; 1 when it does not say).
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) return std::atoi(v);
  return 1;
}

bool oversubscribed(int ranks_per_process) {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 || static_cast<unsigned>(machine_processes() * ranks_per_process) > hw;
}

MPI_Datatype datatype(DType t) {
  return mpi_type(t);
}

void check(int rc, const std::string& where) {
  check_mpi(rc, where);
}

}  // namespace tessera::comm::mpi::runtime_access
