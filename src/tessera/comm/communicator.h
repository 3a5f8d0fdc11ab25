// Communicator: the collective-communication interface every parallel method stands on.
//
// Contract (docs/COMM.md, "Failure behaviour"): all ranks of a communicator call collectives in the
// same order. Every call has a deadline (the communicator's default, or OpOptions::timeout). A
// failed call poisons the communicator: later calls on it fail at once with PeerFailedError. On the
// inproc backend a failure (error, timeout, rank that throws or returns early) also poisons every
// communicator of the world, so every rank fails fast instead of hanging.
//
// Buffers are raw pointers + element count + dtype (later layers reduce slices of flat gradient
// buffers); Tensor overloads forward to them. Reductions support F32, F64, BF16, I32 and I64 (Mean
// on integers truncates); data movement supports every dtype. In place: pass the same pointer as
// send and recv (AllReduce), or send == recv + rank*count (AllGather), or recv == send +
// rank*count (ReduceScatter), or send == recv (AllToAll).
//
// A size-1 communicator short-circuits every call (a copy at most). Thread safety: one thread
// calls into a given Communicator at a time; different communicators (e.g. the results of split)
// may be used concurrently from different threads, and asynchronous calls on different
// communicators progress concurrently.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tessera/comm/errors.h"
#include "tessera/comm/fault.h"
#include "tessera/comm/flight_recorder.h"
#include "tessera/comm/op.h"
#include "tessera/comm/options.h"
#include "tessera/comm/work.h"
#include "tessera/core/tensor.h"

namespace tessera::comm {

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "inproc" or "mpi"
  // This rank's rank in the world it belongs to (the same on every communicator it holds).
  virtual int world_rank() const { return rank(); }
  const std::string& name() const { return opts_.name; }
  const CommOptions& options() const { return opts_; }

  // Collective over this communicator: ranks passing the same color form a new communicator,
  // ranked by (key, rank here). color < 0 joins none and returns nullptr. The new communicator
  // inherits the options; its name is "<name>.<color>".
  std::unique_ptr<Communicator> split(int color, int key, Timeout timeout = kDefaultTimeout);
  // The same, naming the new communicator `name` (every member must pass the same; error
  // messages quote it, so a name that says which world ranks it holds, 'dp[0,2]', helps).
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      Timeout timeout = kDefaultTimeout);

  // recv[i] = op over ranks of send[i]; count elements.
  Work all_reduce(const void* send, void* recv, size_t count, DType dtype,
                  const AllReduceOptions& o = {});
  Work all_reduce(void* inout, size_t count, DType dtype, const AllReduceOptions& o = {}) {
    return all_reduce(inout, inout, count, dtype, o);
  }
  Work all_reduce(Tensor& inout, const AllReduceOptions& o = {});
  // recv[r*count .. (r+1)*count) = send of rank r. send: count elements, recv: size()*count.
  Work all_gather(const void* send, void* recv, size_t count, DType dtype,
                  const AllGatherOptions& o = {});
  Work all_gather(const Tensor& send, Tensor& recv, const AllGatherOptions& o = {});
  // recv (count elements) = op over ranks of send[rank*count .. (rank+1)*count); send:
  // size()*count.
  Work reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                      const ReduceScatterOptions& o = {});
  Work reduce_scatter(const Tensor& send, Tensor& recv, const ReduceScatterOptions& o = {});
  // buf (count elements) of every rank = buf of o.root.
  Work broadcast(void* buf, size_t count, DType dtype, const BroadcastOptions& o = {});
  Work broadcast(Tensor& buf, const BroadcastOptions& o = {});
  // Equal splits: block j of send (count elements) goes to rank j, arriving as block r of its recv.
  Work all_to_all(const void* send, void* recv, size_t count, DType dtype,
                  const AllToAllOptions& o = {});
  Work all_to_all(const Tensor& send, Tensor& recv, const AllToAllOptions& o = {});
  // Variable splits, packed: send holds send_counts[0] elements for rank 0, then send_counts[1]
  // for rank 1, ...; recv receives recv_counts[j] elements from rank j, packed in rank order.
  // recv_counts[j] on this rank must equal send_counts[rank] on rank j (else MismatchError).
  Work all_to_allv(const void* send, std::span<const size_t> send_counts, void* recv,
                   std::span<const size_t> recv_counts, DType dtype, const AllToAllOptions& o = {});
  // The receive counts of an all_to_allv when only the send counts are known: an all_to_all of
  // them (synchronous; entry j = what rank j will send this rank). Collective.
  std::vector<size_t> exchange_counts(std::span<const size_t> send_counts,
                                      const AllToAllOptions& o = {});
  // Point to point, tagged. Messages between a pair with the same tag arrive in order; a recv
  // takes the oldest message from `peer` with its tag, which must have the same dtype and count.
  Work send(const void* buf, size_t count, DType dtype, int peer, const SendOptions& o = {});
  Work send(const Tensor& buf, int peer, const SendOptions& o = {});
  Work recv(void* buf, size_t count, DType dtype, int peer, const RecvOptions& o = {});
  Work recv(Tensor& buf, int peer, const RecvOptions& o = {});
  // Paired exchange (MPI_Sendrecv): sends send_count elements to send_peer and receives
  // recv_count elements from recv_peer at once, so that pairs and rings of exchanges cannot
  // deadlock (pipeline parallelism: send activations on, receive gradients back). Either peer may
  // be -1 to skip that half; the peers may be the same rank. A rank exchanges with itself only in
  // one call (send_peer == rank() exactly when recv_peer == rank(); a copy). The messages are
  // those of send/recv: a send_recv's message may be taken by a recv with its tag and vice versa,
  // and the receive must match the message's dtype and count (else MismatchError). Completes when
  // its own receive has completed and its send buffer may be reused; on the inproc backend the
  // receiver copies straight out of the send buffer, so that is when the peer has received it.
  // The two buffers must not overlap.
  Work send_recv(const void* send, size_t send_count, int send_peer, void* recv, size_t recv_count,
                 int recv_peer, DType dtype, const SendRecvOptions& o = {});
  // Tensor form: the tensors must have the same dtype; the tensor of a skipped half is ignored.
  Work send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer,
                 const SendRecvOptions& o = {});
  Work barrier(const BarrierOptions& o = {});

  // Number of collectives issued so far (the next one gets seq_issued() + 1).
  uint64_t seq_issued() const { return seq_; }

  // Bytes this rank has sent on this communicator, one counter per kind of op: every layer above
  // reads its communication volume here instead of counting its own. The convention is the ring
  // accounting of nccl-tests' bus bytes (a counter divided by the time is the busbw), with
  // n = size() and b = the dtype's size in bytes:
  //   all_reduce      2(n-1)/n x count x b
  //   all_gather      (n-1)/n x the gathered buffer, n x count x b
  //   reduce_scatter  (n-1)/n x the input, n x count x b
  //   broadcast       (n-1)/n x count x b on every rank, the root included. Every broadcast moves
  //                   at least (n-1) x count x b in all (each other rank receives the buffer once);
  //                   the ring convention shares that out evenly, as it does for all_gather, so
  //                   the ranks' counters agree and add up to it whatever the root and algorithm.
  //                   (nccl-tests' busbw factor for broadcast, 1, is the load of the busiest link;
  //                   counted per rank it would add up to n x count x b, more than is sent.)
  //   all_to_all      the blocks sent to the other ranks: (n-1) x count x b; all_to_allv: the
  //                   send_counts of the other ranks x b; exchange_counts is an all_to_all of I64
  //   point_to_point  send: the message; send_recv: its send half (0 when skipped or when a rank
  //                   exchanges with itself); recv: nothing
  // barrier and split count nothing, nor does any call on a size-1 communicator. A call is
  // counted when it is submitted, on the calling thread, asynchronous calls included (traffic()
  // covers them as soon as they return); calls rejected at submission (invalid arguments, a
  // communicator already unusable, an injected throw) send nothing and count nothing, while a call
  // that fails later (a timeout) has been counted. A communicator returned by split counts its
  // own calls from zero. Read and reset from the thread that calls into this communicator.
  struct Traffic {
    double all_reduce = 0, all_gather = 0, reduce_scatter = 0, broadcast = 0, all_to_all = 0,
           point_to_point = 0;
    double total() const {
      return all_reduce + all_gather + reduce_scatter + broadcast + all_to_all + point_to_point;
    }
  };
  const Traffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = Traffic{}; }

  // The flight recorder of this rank (flight_recorder.h): one per world rank, shared by every
  // communicator split from this one; null when CommOptions::flight_recorder_entries is 0 or the
  // communicator has one rank. Created by the first call (or by this).
  std::shared_ptr<FlightRecorder> flight_recorder();

 protected:
  explicit Communicator(CommOptions opts);
  // Runs one operation to completion on the calling thread; throws on failure. `d` is validated,
  // has a resolved timeout and (for collectives) a sequence number. Never called for size() == 1.
  virtual void execute(const detail::OpDesc& d) = 0;
  // Backend split: collective over this communicator; never called concurrently with execute().
  // The new communicator is called `child_name`.
  virtual std::unique_ptr<Communicator> do_split(int color, int key, const std::string& child_name,
                                                 Timeout timeout) = 0;
  // Called once when an operation on this communicator fails (inproc poisons its world).
  virtual void on_failure(const std::exception_ptr&) {}
  // Whether the world this rank belongs to is known to have failed (inproc: poisoned); an
  // injected delay ends early when it has.
  virtual bool world_failed() const { return false; }
  // An injected exit (fault.h): throws InjectedExit, which ends an inproc rank's thread; the MPI
  // backend ends the process with `status` instead.
  [[noreturn]] virtual void exit_rank(const std::string& why, int status);
  // What an exception says ("unknown error" for one that is not a std::exception).
  static std::string what_of(const std::exception_ptr& e);
  // Ends the process as a crash would (no destructors, no MPI_Finalize) after printing
  // "tessera: <why>": an injected exit on the backends whose ranks are processes.
  [[noreturn]] static void exit_process(const std::string& why, int status);
  // Derived destructors call this first: finishes queued work and joins the progress thread.
  void stop_progress_thread();
  Timeout resolve_timeout(Timeout t) const { return t == kDefaultTimeout ? opts_.timeout : t; }
  // "all_reduce #2 (F32 x 1048576, sum) on communicator 'world' rank 0/3": the prefix of every
  // error message about `d` (detail::op_context).
  std::string where(const detail::OpDesc& d) const {
    return detail::op_context(d, name(), rank(), size());
  }
  // A send_recv of a rank with itself (d.peer == d.recv_peer == rank()): copies send to recv.
  static void exchange_with_self(const detail::OpDesc& d);

 private:
  Work submit(detail::OpDesc d, bool async);
  void run_local(const detail::OpDesc& d);  // size-1 short-circuit
  void validate(const detail::OpDesc& d) const;
  void count_traffic(const detail::OpDesc& d);  // adds d's bytes to traffic_ (size() > 1)
  void progress_loop();
  void drain();  // waits until the async queue is empty
  std::exception_ptr record_failure(std::exception_ptr e, const detail::OpDesc& d);
  // Fault injection: null unless CommOptions::fault names this rank; shared with every
  // communicator split from this one, so that the rank's calls are counted together.
  detail::FaultInjector* fault_injector();
  // Applies the fault when `d` is the call it names: sleeps, returns a failed Work, exits, or
  // alters `d` (mismatch). Nothing (nullopt) for every other call.
  std::optional<Work> inject(detail::OpDesc& d);

  CommOptions opts_;
  std::shared_ptr<detail::FaultInjector> faults_;
  // The rank's flight recorder (shared with split communicators), this communicator's index in
  // it, and the calls issued here (every kind), written by submit on the calling thread.
  std::shared_ptr<FlightRecorder> recorder_;
  uint16_t recorder_comm_ = 0;
  uint64_t calls_ = 0;
  // Records `d` in the flight recorder (0: none kept).
  uint64_t record_issue(const detail::OpDesc& d, bool async, bool started);
  void record_end(uint64_t id, bool ok);
  // The first failure of this communicator: dumps the flight recorder (when it has a directory).
  void dump_recorder(std::string_view reason, const std::string& error);
  uint64_t seq_ = 0;
  Traffic traffic_;             // written by submit on the calling thread only
  std::exception_ptr failure_;  // first failure; guarded by mu_

  struct Task {
    detail::OpDesc desc;
    Work work;
    uint64_t record = 0;  // its flight recorder entry
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;  // the progress thread is executing a task
  bool stopping_ = false;
  std::thread progress_;
};

}  // namespace tessera::comm
