// bench-comm: an nccl-tests style table of collective timings, as a library function so that the
// `tessera bench-comm` command and the bench_comm binary share it.
//
// Conventions (nccl-tests): `bytes` is the size of the larger buffer of one rank (AllReduce and
// Broadcast: the buffer; AllGather: the gathered output; ReduceScatter: the input; AllToAll and
// AllToAllV: the send buffer; SendRecv: the message). algbw = bytes / time; busbw = algbw x
// 2(n-1)/n (AllReduce), x (n-1)/n (AllGather, ReduceScatter, AllToAll, AllToAllV), x 1
// (Broadcast, SendRecv). Times: before every iteration a barrier; each rank times its call; an
// iteration's time is the maximum over ranks; the table shows the median.
//
// send_recv is a ping-pong between ranks 0 and 1 (the others wait at the barrier): rank 0 sends
// the message with send_recv(to 1, no receive), rank 1 receives it with send_recv(no send, from 0)
// and sends it back the same way; time_us is half the round trip (the one-way latency) and
// algbw = bytes / that. all_to_allv: every rank sends `bytes` in all, split over the ranks by
// deterministic pseudo-random weights (alltoallv_count), so the blocks differ in size.
// Every size is checked for correctness before it is timed, and buffers rotate through a pool
// (BenchOptions::rotate_bytes per rank) so that large sizes are not measured from cache.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::comm {

struct BenchOptions {
  std::vector<std::string> ops = {"all_reduce", "all_gather",  "reduce_scatter", "broadcast",
                                  "all_to_all", "all_to_allv", "send_recv"};
  size_t min_bytes = 4;
  size_t max_bytes = size_t{256} << 20;
  int iters = 20;     // timed iterations at sizes up to 1 MiB; fewer above, down to min_iters
  int min_iters = 5;  // timed iterations at the largest sizes
  int warmup = 5;
  DType dtype = DType::F32;
  Algorithm algorithm = Algorithm::Auto;  // AllReduce algorithm
  size_t rotate_bytes = size_t{512} << 20;
};

struct BenchRow {
  std::string op;
  size_t bytes = 0;
  size_t elements = 0;  // elements of the `bytes` buffer
  double median_us = 0;
  double algbw_gbs = 0;  // GB/s = 1e9 bytes/s
  double busbw_gbs = 0;
  bool ok = false;  // the correctness check passed
};

// Elements rank `from` sends rank `to` in the all_to_allv benchmark: `elems` split over the n
// ranks in proportion to weights 1..8 drawn from (from, to) by a fixed hash; the last rank gets
// the remainder, so a rank sends exactly `elems`. Every rank computes every count.
size_t alltoallv_count(int from, int to, int n, size_t elems);

// "all_reduce,all_gather" or "all" -> op names; throws ConfigError on unknown names.
std::vector<std::string> parse_bench_ops(const std::string& csv);
double bus_factor(const std::string& op, int n);

// Collective over `comm`: every rank calls it with the same options; every rank gets the rows.
// When `out` is non-null the rows are printed as they complete (call with out only on rank 0).
std::vector<BenchRow> bench_collectives(Communicator& comm, const BenchOptions& opts,
                                        std::ostream* out);

// Times run(i) for i in [0, warmup + iters) on every rank of `comm` as described above and
// returns the median over the timed iterations of the per-iteration maximum over ranks, in
// microseconds. Collective over `comm`.
double time_collective_us(Communicator& comm, int warmup, int iters,
                          const std::function<void(int)>& run);

// Iterations used at a size: opts.iters up to 1 MiB, then proportionally fewer (at least
// opts.min_iters).
int bench_iters(const BenchOptions& opts, size_t bytes);

std::string bench_header(const Communicator& comm, const BenchOptions& opts);
std::string bench_row_str(const BenchRow& r);

// Memory bandwidth of this machine, for comparison with in-process busbw: single-thread memcpy
// of `bytes` (median of `reps`), in GB/s of bytes copied (each byte is read once and written once).
double measure_memcpy_gbs(size_t bytes = size_t{256} << 20, int reps = 7);
// The same with `threads` threads each copying its own buffer concurrently; aggregate GB/s.
double measure_memcpy_gbs_threads(int threads, size_t bytes_per_thread = size_t{256} << 20,
                                  int reps = 7);

}  // namespace tessera::comm
