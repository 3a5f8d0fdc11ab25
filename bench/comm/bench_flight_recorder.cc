// bench_flight_recorder: what the flight recorder (comm/flight_recorder.h) costs a small
// all_reduce on 2 thread-ranks. Rounds alternate between a world that records (4096 entries, the
// default) and one that does not (flight_recorder_entries = 0), so that both see the same load;
// each round times `iters` calls, synchronous and asynchronous (issued, then waited for). Prints
// the median per-call time of each and the difference. First, the ring alone: a call's record
// (issued, then ended) on one thread, in nanoseconds, which the machine's load affects much less
// than the thread-rank handoff of an all_reduce does.
//   bench_flight_recorder [rounds=31] [iters=2000] [floats=256]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tessera/comm/flight_recorder.h"
#include "tessera/comm/launch.h"

using namespace tessera;
using namespace tessera::comm;

namespace {

using Clock = std::chrono::steady_clock;

// Microseconds per call of one round: {synchronous, asynchronous}.
std::pair<double, double> round(size_t entries, int iters, size_t floats) {
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  o.flight_recorder_entries = entries;
  double sync_us = 0, async_us = 0;
  run_inproc(
      2,
      [&](Communicator& c) {
        std::vector<float> x(floats, 1.0f);
        AllReduceOptions async;
        async.async = true;
        for (int pass = 0; pass < 2; ++pass) {
          c.barrier().wait();
          const auto t0 = Clock::now();
          for (int i = 0; i < iters; ++i) {
            if (pass == 0)
              c.all_reduce(x.data(), floats, DType::F32).wait();
            else
              c.all_reduce(x.data(), floats, DType::F32, async).wait();
          }
          c.barrier().wait();
          const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
          if (c.rank() == 0) (pass == 0 ? sync_us : async_us) = us / iters;
        }
      },
      o);
  return {sync_us, async_us};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 31;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 2000;
  const size_t floats = argc > 3 ? static_cast<size_t>(std::atol(argv[3])) : 256;
  {
    FlightRecorder fr(0, 2, 4096, "");
    const uint16_t c = fr.add_communicator("world", 0, 2);
    comm::detail::OpDesc d;
    d.type = comm::detail::OpType::AllReduce;
    d.count = floats;
    std::vector<double> ns;
    for (int r = 0; r < rounds; ++r) {
      constexpr int kCalls = 200000;
      const auto t0 = Clock::now();
      for (int i = 0; i < kCalls; ++i) {
        d.seq = static_cast<uint64_t>(i) + 1;
        fr.ended(fr.issued(c, d, d.seq, false, true), true);
      }
      ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kCalls);
    }
    std::printf("one call's record (issued + ended), one thread: median %.1f ns\n", median(ns));
  }
  std::vector<double> on_sync, off_sync, on_async, off_async;
  for (int r = 0; r < rounds; ++r) {
    // Which world goes first alternates.
    for (int k = 0; k < 2; ++k) {
      const bool on = (r + k) % 2 == 0;
      const auto [s, a] = round(on ? 4096 : 0, iters, floats);
      (on ? on_sync : off_sync).push_back(s);
      (on ? on_async : off_async).push_back(a);
    }
  }
  std::printf("all_reduce of %zu floats on 2 thread-ranks, median of %d rounds x %d calls\n",
              floats, rounds, iters);
  std::printf("%-6s %12s %12s %10s\n", "", "recorder us", "without us", "diff us");
  std::printf("%-6s %12.3f %12.3f %10.3f\n", "sync", median(on_sync), median(off_sync),
              median(on_sync) - median(off_sync));
  std::printf("%-6s %12.3f %12.3f %10.3f\n", "async", median(on_async), median(off_async),
              median(on_async) - median(off_async));
  return 0;
}
