// bench_stream_stores: should the inproc Direct all-reduce write its outputs with non-temporal
// stores? They make the all-reduce itself faster on large messages but leave the output out of
// cache for whoever reads it next. This times, on 2 thread-ranks, an in-place all-reduce of the
// same buffer (as data parallelism does with a gradient bucket) followed by a consumer that reads
// the result and rewrites the buffer (as the optimizer and the next backward do), with streaming
// forced on (stream_min_bytes 0) and off (never), at 64 KiB to 64 MiB. Medians of 200 iterations
// down to 20; the crossover sets CommOptions::stream_min_bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <vector>

#include "tessera/comm/launch.h"

using namespace tessera;
using namespace tessera::comm;
using Clock = std::chrono::steady_clock;

namespace {

struct Times {
  double all_reduce_us = 0, consumer_us = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Times measure(size_t bytes, bool streaming) {
  CommOptions o;
  o.stream_min_bytes = streaming ? 0 : std::numeric_limits<size_t>::max();
  const size_t n = bytes / sizeof(float);
  const int iters = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, 20, 200));
  Times t;
  run_inproc(
      2,
      [&](Communicator& c) {
        std::vector<float> grad(n, 1.0f + static_cast<float>(c.rank()));
        std::vector<double> ar, cons;
        float sink = 0;
        for (int i = 0; i < iters + 3; ++i) {
          c.barrier().wait();
          const auto t0 = Clock::now();
          c.all_reduce(grad.data(), n, DType::F32).wait();
          c.barrier().wait();
          const auto t1 = Clock::now();
          for (size_t j = 0; j < n; ++j) {  // read the result, write the next step's gradient
            sink += grad[j];
            grad[j] = grad[j] * 0.5f;
          }
          c.barrier().wait();
          const auto t2 = Clock::now();
          if (i >= 3) {
            ar.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            cons.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
          }
        }
        if (c.rank() == 0) t = {median(ar), median(cons)};
        if (sink == 42.0f) std::printf(" ");  // keep the consumer loop
      },
      o);
  return t;
}

}  // namespace

int main() {
  std::printf(
      "# bench_stream_stores: 2 inproc ranks, in-place all_reduce + consumer (us, medians)\n");
  std::printf("%10s %14s %14s %14s %14s %10s\n", "bytes", "stream_ar", "stream_total", "plain_ar",
              "plain_total", "plain/strm");
  for (size_t bytes = size_t{64} << 10; bytes <= (size_t{64} << 20); bytes *= 2) {
    const Times s = measure(bytes, true), p = measure(bytes, false);
    const double ts = s.all_reduce_us + s.consumer_us, tp = p.all_reduce_us + p.consumer_us;
    std::printf("%10zu %14.1f %14.1f %14.1f %14.1f %10.2f\n", bytes, s.all_reduce_us, ts,
                p.all_reduce_us, tp, tp / ts);
    std::fflush(stdout);
  }
  return 0;
}
