// Options of the collective calls (c10d style): every call takes an options struct carrying its
// reduce op, algorithm, timeout and whether it runs asynchronously.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "tessera/core/dtype.h"

namespace tessera::comm {

using Timeout = std::chrono::milliseconds;
// "Use the communicator's default timeout" (CommOptions::timeout).
inline constexpr Timeout kDefaultTimeout{-1};

struct FaultSpec;  // fault.h

enum class ReduceOp : uint8_t { Sum, Mean, Max, Min };
std::string_view reduce_op_name(ReduceOp op);

// AllReduce algorithm of the inproc backend. Auto picks by message size and rank count; the others
// force one (tests cover each).
//   Small:  copy into a per-rank staging slot, one barrier, every rank reduces all slots
//           (lowest latency; up to CommOptions::small_max_bytes, above which Direct runs).
//   Direct: zero-copy; the message is cut into blocks that the ranks claim from a shared queue;
//           the rank that claims a block reduces it reading every rank's input in place and
//           writes the result into every rank's output (docs/COMM.md).
//   Ring:   chunked, pipelined ring ReduceScatter followed by ring AllGather.
// The MPI backend ignores this field: it runs its own ring over point-to-point messages for
// mid-sized messages and MPI_Iallreduce otherwise (docs/COMM.md gives the sizes and why).
enum class Algorithm : uint8_t { Auto, Small, Direct, Ring };
std::string_view algorithm_name(Algorithm a);

// Fields common to every call.
struct OpOptions {
  Timeout timeout = kDefaultTimeout;  // per-call deadline; kDefaultTimeout = the communicator's
  // false: the call runs to completion on the caller's thread and returns a completed Work.
  // true: the call is queued on the communicator's progress thread (in call order) and returns
  // at once; Work::wait() blocks until it completes. Either way errors come out of wait().
  bool async = false;
};

struct AllReduceOptions : OpOptions {
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Auto;
};
struct ReduceScatterOptions : OpOptions {
  ReduceOp op = ReduceOp::Sum;
};
struct AllGatherOptions : OpOptions {};
struct BroadcastOptions : OpOptions {
  int root = 0;
};
struct AllToAllOptions : OpOptions {};
struct BarrierOptions : OpOptions {};
struct SendOptions : OpOptions {
  int tag = 0;
};
struct RecvOptions : OpOptions {
  int tag = 0;
};
struct SendRecvOptions : OpOptions {
  int send_tag = 0;  // tag of the message sent
  int recv_tag = 0;  // tag of the message received
};

inline constexpr size_t kDefaultStreamMinBytes = size_t{4} << 20;

// Group-wide settings, fixed when a world is created and inherited by split().
struct CommOptions {
  // Default deadline of every wait. Overridden by the environment variable
  // TESSERA_COMM_TIMEOUT_S (seconds, may be fractional) when it is set and `timeout` is left at
  // kDefaultTimeout; otherwise 300 s.
  Timeout timeout = kDefaultTimeout;
  // Debug mode: before each collective the ranks exchange a fingerprint (sequence number, op,
  // dtype, count, root, reduce op) and every rank fails with a MismatchError naming the op and the
  // disagreeing ranks. Also enabled by TESSERA_COMM_DEBUG=1. The inproc backend always checks
  // (it costs nothing there); on MPI it costs one extra small allgather per collective.
  bool debug = false;
  // Messages up to this many bytes use the Small AllReduce algorithm under Algorithm::Auto.
  size_t small_max_bytes = 16 * 1024;
  // Under Algorithm::Auto the inproc backend uses Direct for up to this many ranks, Ring above.
  int direct_max_ranks = 8;
  // The inproc Direct AllReduce writes outputs with non-temporal (cache-bypassing) stores from this
  // many bytes on. They save a third of the memory traffic when the buffers are not in cache (a
  // model whose gradients outgrow the caches), and cost a trip to memory when they were
  // (bench/comm/bench_stream_stores; docs/PERFORMANCE.md). Left at kDefaultStreamMinBytes, the
  // environment variable TESSERA_COMM_STREAM_MIN_BYTES overrides it.
  size_t stream_min_bytes = kDefaultStreamMinBytes;
  // Ring pipelining, on both backends: each of the n chunks of a ring all-reduce (inproc
  // Algorithm::Ring; MPI from 64 KiB to 64 MiB) is cut into segments of at most this many bytes
  // (at least one element). The segment size never changes the result's bits.
  size_t ring_segment_bytes = 256 * 1024;
  std::string name = "world";  // appears in error messages
  // Fault injection (fault.h, docs/RELIABILITY.md): one world rank misbehaves at one call. Left
  // null, the environment variable TESSERA_FAULT sets it. A mismatch fault turns on `debug`, so
  // that the MPI backend checks fingerprints and catches it.
  std::shared_ptr<const FaultSpec> fault;
  // The flight recorder (flight_recorder.h, docs/RELIABILITY.md): each world rank keeps its last
  // `flight_recorder_entries` calls (0: none); when `flight_recorder` names a directory, a call's
  // failure or timeout and an injected fault dump them to DIR/rank-<R>.json. Left empty, the
  // environment variable TESSERA_FLIGHT_RECORDER sets it.
  std::string flight_recorder;
  size_t flight_recorder_entries = 4096;
};

// Resolves kDefaultTimeout against TESSERA_COMM_TIMEOUT_S and the 300 s default, debug against
// TESSERA_COMM_DEBUG, kDefaultStreamMinBytes against TESSERA_COMM_STREAM_MIN_BYTES, a null
// fault against TESSERA_FAULT, and an empty flight_recorder against TESSERA_FLIGHT_RECORDER.
// Malformed values are ConfigErrors.
CommOptions resolve_options(CommOptions opts);

}  // namespace tessera::comm
