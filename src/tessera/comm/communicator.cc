#include "tessera/comm/communicator.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <utility>

namespace tessera::comm {

using detail::OpDesc;
using detail::OpType;

Communicator::Communicator(CommOptions opts) : opts_(std::move(opts)) {}

Communicator::~Communicator() {
  stop_progress_thread();
}

void Communicator::stop_progress_thread() {
  {
    std::unique_lock lk(mu_);
    if (!progress_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  progress_.join();
}

void Communicator::drain() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

std::string Communicator::what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

std::exception_ptr Communicator::record_failure(std::exception_ptr e, const OpDesc& d) {
  (void)d;
  bool first = false;
  {
    std::lock_guard lk(mu_);
    if (!failure_) {
      failure_ = e;
      first = true;
    }
  }
  if (first) {
    on_failure(e);  // first: the peers fail fast, then the dump is written
    dump_recorder(failure_reason(e), what_of(e));
  }
  return e;
}

// ---- flight recorder (flight_recorder.h) -------------------------------------------------------

std::shared_ptr<FlightRecorder> Communicator::flight_recorder() {
  if (!recorder_ && opts_.flight_recorder_entries > 0 && size() > 1) {
    recorder_ = std::make_shared<FlightRecorder>(
        world_rank(), size(), opts_.flight_recorder_entries, opts_.flight_recorder);
    recorder_comm_ = recorder_->add_communicator(name(), rank(), size());
  }
  return recorder_;
}

uint64_t Communicator::record_issue(const OpDesc& d, bool async, bool started) {
  ++calls_;
  return recorder_ ? recorder_->issued(recorder_comm_, d, calls_, async, started) : 0;
}

void Communicator::record_end(uint64_t id, bool ok) {
  if (recorder_) recorder_->ended(id, ok);
}

void Communicator::dump_recorder(std::string_view reason, const std::string& error) {
  if (!recorder_) return;
  recorder_->note_failure(reason, error);
  recorder_->dump(reason, error);
}

void Communicator::validate(const OpDesc& d) const {
  const int n = size();
  auto fail = [&](const std::string& why) { throw CommUsageError(where(d) + ": " + why); };
  if ((d.type == OpType::AllReduce || d.type == OpType::ReduceScatter) &&
      !detail::reduction_supported(d.dtype))
    fail(detail::concat("reductions support F32, F64, BF16, I32 and I64, not ",
                        dtype_name(d.dtype)));
  if (d.type == OpType::Broadcast && (d.root < 0 || d.root >= n))
    fail(detail::concat("root ", d.root, " is not a rank of a communicator of size ", n));
  if (d.type == OpType::Send || d.type == OpType::Recv) {
    if (d.peer < 0 || d.peer >= n || d.peer == rank())
      fail(detail::concat("peer ", d.peer, " is not another rank of a communicator of size ", n));
    if (d.tag < 0) fail("tags must be non-negative");
  }
  if (d.type == OpType::SendRecv) {
    for (auto [peer, half] : {std::pair{d.peer, "send"}, std::pair{d.recv_peer, "receive"}})
      if (peer < -1 || peer >= n)
        fail(detail::concat(half, " peer ", peer, " is not a rank of a communicator of size ", n,
                            " (or -1 to skip the ", half, ")"));
    if ((d.peer == rank()) != (d.recv_peer == rank()))
      fail(
          "a rank exchanges with itself only in one call: send_peer == rank() requires "
          "recv_peer == rank() and vice versa");
    if (d.tag < 0 || d.recv_tag < 0) fail("tags must be non-negative");
    const size_t es = dtype_size(d.dtype);
    const size_t sb = d.peer >= 0 ? d.count * es : 0, rb = d.recv_peer >= 0 ? d.recv_count * es : 0;
    if (sb && d.send == nullptr) fail("null send buffer");
    if (rb && d.recv == nullptr) fail("null recv buffer");
    const auto s0 = reinterpret_cast<uintptr_t>(d.send), r0 = reinterpret_cast<uintptr_t>(d.recv);
    if (sb && rb && s0 < r0 + rb && r0 < s0 + sb) fail("the send and recv buffers overlap");
    if (d.peer == rank() && (d.count != d.recv_count || d.tag != d.recv_tag))
      fail(detail::concat("exchanging with itself, this rank sends ", d.count,
                          " elements with tag ", d.tag, " but receives ", d.recv_count,
                          " with tag ", d.recv_tag));
    return;
  }
  if (d.type == OpType::AllToAllV &&
      (static_cast<int>(d.send_counts.size()) != n || static_cast<int>(d.recv_counts.size()) != n))
    fail(detail::concat("send_counts and recv_counts need one entry per rank (", n, ")"));
  bool needs_data = d.count > 0 && d.type != OpType::AllToAllV;
  if (needs_data && d.type != OpType::Recv && d.send == nullptr) fail("null send buffer");
  if (needs_data && d.type != OpType::Send && d.recv == nullptr) fail("null recv buffer");
}

void Communicator::count_traffic(const OpDesc& d) {
  const double n = size(), es = static_cast<double>(dtype_size(d.dtype));
  const double bytes = static_cast<double>(d.count) * es;
  switch (d.type) {
    case OpType::AllReduce:
      traffic_.all_reduce += 2 * (n - 1) / n * bytes;
      return;
    case OpType::AllGather:
      traffic_.all_gather += (n - 1) * bytes;  // (n-1)/n x n x count
      return;
    case OpType::ReduceScatter:
      traffic_.reduce_scatter += (n - 1) * bytes;
      return;
    case OpType::Broadcast:
      traffic_.broadcast += (n - 1) / n * bytes;
      return;
    case OpType::AllToAll:
      traffic_.all_to_all += (n - 1) * bytes;
      return;
    case OpType::AllToAllV: {
      size_t elems = 0;
      for (int p = 0; p < size(); ++p)
        if (p != rank()) elems += d.send_counts[p];
      traffic_.all_to_all += static_cast<double>(elems) * es;
      return;
    }
    case OpType::Send:
      traffic_.point_to_point += bytes;
      return;
    case OpType::SendRecv:
      if (d.peer >= 0 && d.peer != rank()) traffic_.point_to_point += bytes;
      return;
    case OpType::Recv:
    case OpType::Barrier:
    case OpType::Split:
      return;
  }
}

void Communicator::run_local(const OpDesc& d) {
  const size_t es = dtype_size(d.dtype);
  auto copy = [&](size_t elems) {
    if (elems && d.send != d.recv) std::memcpy(d.recv, d.send, elems * es);
  };
  switch (d.type) {
    case OpType::AllReduce:
    case OpType::AllGather:
    case OpType::ReduceScatter:
    case OpType::AllToAll:
      copy(d.count);
      break;
    case OpType::AllToAllV:
      if (d.send_counts[0] != d.recv_counts[0])
        throw MismatchError(detail::concat(where(d), ": rank 0 sends ", d.send_counts[0],
                                           " elements to itself but expects ", d.recv_counts[0]));
      copy(d.send_counts[0]);
      break;
    case OpType::SendRecv:
      if (d.peer == 0) exchange_with_self(d);  // validated: the peers are 0 or both -1
      break;
    default:
      break;  // Broadcast (in place), Barrier: nothing to do
  }
}

void Communicator::exchange_with_self(const OpDesc& d) {
  if (d.count && d.send != d.recv) std::memcpy(d.recv, d.send, d.count * dtype_size(d.dtype));
}

Work Communicator::submit(OpDesc d, bool async) {
  validate(d);
  d.timeout = resolve_timeout(d.timeout);
  if (detail::is_collective(d.type)) d.seq = ++seq_;
  if (size() == 1) {
    try {
      run_local(d);
      return Work();
    } catch (...) {
      return Work::failed(std::current_exception());
    }
  }
  if (!recorder_) (void)flight_recorder();
  if (opts_.fault)
    if (std::optional<Work> w = inject(d)) return std::move(*w);
  std::unique_lock lk(mu_);
  if (failure_) {
    record_end(record_issue(d, async, true), false);
    return Work::failed(std::make_exception_ptr(PeerFailedError(detail::concat(
        where(d),
        " not run: the communicator is unusable after an earlier failure: ", what_of(failure_)))));
  }
  count_traffic(d);  // accepted: run now or queued
  if (!async && queue_.empty() && !busy_) {
    lk.unlock();
    const uint64_t rec = record_issue(d, false, true);
    const auto t0 = std::chrono::steady_clock::now();
    auto waited = [&] {
      if (recorder_) recorder_->add_wait(std::chrono::steady_clock::now() - t0);
    };
    try {
      execute(d);
      record_end(rec, true);
      waited();
      return Work();
    } catch (...) {
      record_end(rec, false);
      waited();
      return Work::failed(record_failure(std::current_exception(), d));
    }
  }
  const uint64_t rec = record_issue(d, async, false);
  Work w = Work::pending(where(d), recorder_);
  queue_.push_back(Task{std::move(d), w, rec});
  if (!progress_.joinable()) progress_ = std::thread([this] { progress_loop(); });
  lk.unlock();
  cv_.notify_all();
  if (!async) {
    try {
      w.wait();
    } catch (...) {
    }
  }
  return w;
}

void Communicator::progress_loop() {
  for (;;) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    Task t = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    std::exception_ptr failed = failure_;
    lk.unlock();
    std::exception_ptr err;
    if (failed) {
      err = std::make_exception_ptr(PeerFailedError(detail::concat(
          where(t.desc),
          " not run: the communicator is unusable after an earlier failure: ", what_of(failed))));
      record_end(t.record, false);
    } else {
      if (recorder_) recorder_->started(t.record);
      try {
        execute(t.desc);
        record_end(t.record, true);
      } catch (...) {
        record_end(t.record, false);  // before record_failure's dump
        err = record_failure(std::current_exception(), t.desc);
      }
    }
    t.work.complete(err);
    lk.lock();
    busy_ = false;
    lk.unlock();
    cv_.notify_all();
  }
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, Timeout timeout) {
  return split(color, key, detail::concat(name(), ".", color), timeout);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const std::string& child_name,
                                                  Timeout timeout) {
  drain();
  OpDesc d;
  d.type = OpType::Split;
  d.seq = seq_ + 1;
  {
    std::lock_guard lk(mu_);
    if (failure_)
      throw PeerFailedError(detail::concat(where(d),
                                           " not run: the communicator is unusable after an "
                                           "earlier failure: ",
                                           what_of(failure_)));
  }
  ++seq_;
  if (size() > 1 && !recorder_) (void)flight_recorder();
  const uint64_t rec = size() > 1 ? record_issue(d, false, true) : 0;
  try {
    std::unique_ptr<Communicator> child =
        do_split(color, key, child_name, resolve_timeout(timeout));
    record_end(rec, true);
    if (child && fault_injector()) child->faults_ = faults_;  // one count per rank
    if (child && recorder_) {                                 // one recorder per rank
      child->recorder_ = recorder_;
      child->recorder_comm_ =
          recorder_->add_communicator(child->name(), child->rank(), child->size());
    }
    return child;
  } catch (...) {
    record_end(rec, false);
    record_failure(std::current_exception(), d);
    throw;
  }
}

// ---- fault injection (fault.h) -----------------------------------------------------------------

detail::FaultInjector* Communicator::fault_injector() {
  if (!faults_ && opts_.fault && opts_.fault->rank == world_rank())
    faults_ = std::make_shared<detail::FaultInjector>(*opts_.fault);
  return faults_.get();
}

void Communicator::exit_process(const std::string& why, int status) {
  std::fprintf(stderr, "tessera: %s\n", why.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}

void Communicator::exit_rank(const std::string& why, int status) {
  (void)status;
  throw InjectedExit(why);
}

std::optional<Work> Communicator::inject(OpDesc& d) {
  detail::FaultInjector* f = fault_injector();
  if (f == nullptr || !f->fires(d, name())) return std::nullopt;
  const FaultSpec& spec = f->spec();
  const std::string at = where(d);
  // Prints the line and dumps the flight recorder (reason "injected_fault", or "exit").
  auto announce = [&](const std::string& action, std::string_view reason = "injected_fault") {
    const std::string line =
        detail::concat("TESSERA_FAULT=", spec.text, " fires on world rank ", world_rank(),
                       " at its call ", spec.op, ", ", at, ": ", action);
    std::fprintf(stderr, "tessera: %s\n", line.c_str());
    std::fflush(stderr);
    if (!recorder_) return;
    if (reason == "exit") recorder_->note_failure(reason, line);  // later dumps keep it
    recorder_->dump(reason, line);
  };
  switch (spec.kind) {
    case FaultKind::Delay: {
      announce(detail::concat("delaying it by ", spec.delay.count(), " ms"));
      const auto until = std::chrono::steady_clock::now() + spec.delay;
      while (std::chrono::steady_clock::now() < until && !world_failed())
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            std::chrono::milliseconds(5), until - std::chrono::steady_clock::now()));
      return std::nullopt;
    }
    case FaultKind::Throw: {
      announce("failing it");
      record_end(record_issue(d, false, true), false);
      return Work::failed(record_failure(std::make_exception_ptr(InjectedFaultError(detail::concat(
                                             at, ": injected fault (TESSERA_FAULT=", spec.text,
                                             ") on world rank ", world_rank()))),
                                         d));
    }
    case FaultKind::Exit:
      announce(backend() == "mpi"
                   ? detail::concat("the process exits with status ", spec.exit_status)
                   : std::string("the rank exits"),
               "exit");
      exit_rank(detail::concat(at, ": world rank ", world_rank(),
                               " exited here (injected fault TESSERA_FAULT=", spec.text, ")"),
                spec.exit_status);
      return std::nullopt;  // not reached: exit_rank does not return
    case FaultKind::Mismatch: {
      const std::string was = d.describe();
      detail::make_mismatched(d);
      announce(detail::concat("issuing ", d.describe(), " instead of ", was));
      return std::nullopt;
    }
    case FaultKind::Skip:  // as if it had run: the peers wait for it
      announce("skipping it (the call is not issued)");
      return Work();
  }
  return std::nullopt;
}

// ---- argument packing -------------------------------------------------------------------------

namespace {
OpDesc make_desc(OpType type, const void* send, void* recv, size_t count, DType dtype,
                 const OpOptions& o) {
  OpDesc d;
  d.type = type;
  d.send = send;
  d.recv = recv;
  d.count = count;
  d.dtype = dtype;
  d.timeout = o.timeout;
  return d;
}
}  // namespace

Work Communicator::all_reduce(const void* send, void* recv, size_t count, DType dtype,
                              const AllReduceOptions& o) {
  OpDesc d = make_desc(OpType::AllReduce, send, recv, count, dtype, o);
  d.op = o.op;
  d.algorithm = o.algorithm;
  return submit(std::move(d), o.async);
}

Work Communicator::all_gather(const void* send, void* recv, size_t count, DType dtype,
                              const AllGatherOptions& o) {
  return submit(make_desc(OpType::AllGather, send, recv, count, dtype, o), o.async);
}

Work Communicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                  const ReduceScatterOptions& o) {
  OpDesc d = make_desc(OpType::ReduceScatter, send, recv, count, dtype, o);
  d.op = o.op;
  return submit(std::move(d), o.async);
}

Work Communicator::broadcast(void* buf, size_t count, DType dtype, const BroadcastOptions& o) {
  OpDesc d = make_desc(OpType::Broadcast, buf, buf, count, dtype, o);
  d.root = o.root;
  return submit(std::move(d), o.async);
}

Work Communicator::all_to_all(const void* send, void* recv, size_t count, DType dtype,
                              const AllToAllOptions& o) {
  return submit(make_desc(OpType::AllToAll, send, recv, count, dtype, o), o.async);
}

Work Communicator::all_to_allv(const void* send, std::span<const size_t> send_counts, void* recv,
                               std::span<const size_t> recv_counts, DType dtype,
                               const AllToAllOptions& o) {
  OpDesc d =
      make_desc(OpType::AllToAllV, send, recv,
                std::accumulate(send_counts.begin(), send_counts.end(), size_t{0}), dtype, o);
  d.send_counts.assign(send_counts.begin(), send_counts.end());
  d.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  return submit(std::move(d), o.async);
}

std::vector<size_t> Communicator::exchange_counts(std::span<const size_t> send_counts,
                                                  const AllToAllOptions& o) {
  const size_t n = static_cast<size_t>(size());
  if (send_counts.size() != n)
    throw CommUsageError(detail::concat("exchange_counts on communicator '", name(), "' rank ",
                                        rank(), "/", size(), ": ", send_counts.size(),
                                        " send counts, one per rank (", n, ") needed"));
  std::vector<int64_t> mine(send_counts.begin(), send_counts.end()), theirs(n);
  AllToAllOptions sync = o;
  sync.async = false;
  all_to_all(mine.data(), theirs.data(), 1, DType::I64, sync).wait();
  return std::vector<size_t>(theirs.begin(), theirs.end());
}

Work Communicator::send(const void* buf, size_t count, DType dtype, int peer,
                        const SendOptions& o) {
  OpDesc d = make_desc(OpType::Send, buf, nullptr, count, dtype, o);
  d.peer = peer;
  d.tag = o.tag;
  return submit(std::move(d), o.async);
}

Work Communicator::recv(void* buf, size_t count, DType dtype, int peer, const RecvOptions& o) {
  OpDesc d = make_desc(OpType::Recv, nullptr, buf, count, dtype, o);
  d.peer = peer;
  d.tag = o.tag;
  return submit(std::move(d), o.async);
}

Work Communicator::send_recv(const void* send, size_t send_count, int send_peer, void* recv,
                             size_t recv_count, int recv_peer, DType dtype,
                             const SendRecvOptions& o) {
  OpDesc d = make_desc(OpType::SendRecv, send, recv, send_count, dtype, o);
  d.peer = send_peer;
  d.tag = o.send_tag;
  d.recv_count = recv_count;
  d.recv_peer = recv_peer;
  d.recv_tag = o.recv_tag;
  return submit(std::move(d), o.async);
}

Work Communicator::barrier(const BarrierOptions& o) {
  return submit(make_desc(OpType::Barrier, nullptr, nullptr, 0, DType::F32, o), o.async);
}

// ---- Tensor overloads -------------------------------------------------------------------------

static void check_sizes(bool ok, std::string_view op, const Tensor& a, const Tensor& b,
                        const std::string& want) {
  if (!ok)
    throw CommUsageError(detail::concat(op, ": tensors ", shape_str(a.shape()), " ",
                                        dtype_name(a.dtype()), " and ", shape_str(b.shape()), " ",
                                        dtype_name(b.dtype()), " do not fit: ", want));
}

Work Communicator::all_reduce(Tensor& inout, const AllReduceOptions& o) {
  return all_reduce(inout.raw(), inout.raw(), static_cast<size_t>(inout.numel()), inout.dtype(), o);
}

Work Communicator::all_gather(const Tensor& send, Tensor& recv, const AllGatherOptions& o) {
  check_sizes(send.dtype() == recv.dtype() && recv.numel() == send.numel() * size(), "all_gather",
              send, recv, "recv needs size() x the elements of send and the same dtype");
  return all_gather(send.raw(), recv.raw(), static_cast<size_t>(send.numel()), send.dtype(), o);
}

Work Communicator::reduce_scatter(const Tensor& send, Tensor& recv, const ReduceScatterOptions& o) {
  check_sizes(send.dtype() == recv.dtype() && send.numel() == recv.numel() * size(),
              "reduce_scatter", send, recv,
              "send needs size() x the elements of recv and the same dtype");
  return reduce_scatter(send.raw(), recv.raw(), static_cast<size_t>(recv.numel()), recv.dtype(), o);
}

Work Communicator::broadcast(Tensor& buf, const BroadcastOptions& o) {
  return broadcast(buf.raw(), static_cast<size_t>(buf.numel()), buf.dtype(), o);
}

Work Communicator::all_to_all(const Tensor& send, Tensor& recv, const AllToAllOptions& o) {
  check_sizes(
      send.dtype() == recv.dtype() && send.numel() == recv.numel() && send.numel() % size() == 0,
      "all_to_all", send, recv, "same elements and dtype, divisible by size()");
  return all_to_all(send.raw(), recv.raw(), static_cast<size_t>(send.numel() / size()),
                    send.dtype(), o);
}

Work Communicator::send(const Tensor& buf, int peer, const SendOptions& o) {
  return send(buf.raw(), static_cast<size_t>(buf.numel()), buf.dtype(), peer, o);
}

Work Communicator::recv(Tensor& buf, int peer, const RecvOptions& o) {
  return recv(buf.raw(), static_cast<size_t>(buf.numel()), buf.dtype(), peer, o);
}

Work Communicator::send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer,
                             const SendRecvOptions& o) {
  const bool both = send_peer >= 0 && recv_peer >= 0;
  check_sizes(!both || send.dtype() == recv.dtype(), "send_recv", send, recv, "the same dtype");
  const DType t = send_peer >= 0 ? send.dtype() : recv.dtype();
  return send_recv(send_peer >= 0 ? send.raw() : nullptr,
                   send_peer >= 0 ? static_cast<size_t>(send.numel()) : 0, send_peer,
                   recv_peer >= 0 ? recv.raw() : nullptr,
                   recv_peer >= 0 ? static_cast<size_t>(recv.numel()) : 0, recv_peer, t, o);
}

}  // namespace tessera::comm
