// All-reduce bus bandwidth (nccl-tests convention, busbw = algbw x 2(n-1)/n) with the collectives
// alone: ranks are threads of this process, or processes under mpirun.
//   allreduce_bench [ranks]
#include <tessera/comm.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace tessera;
  const int ranks = argc > 1 ? std::stoi(argv[1]) : 2;
  comm::run_ranks(comm::Backend::Auto, ranks, [](comm::Communicator& c) {
    for (size_t bytes = size_t{1} << 12; bytes <= size_t{1} << 24; bytes <<= 2) {
      std::vector<float> buf(bytes / sizeof(float), 1.0f);
      c.all_reduce(buf.data(), buf.size(), DType::F32).wait();  // warm-up, and a check
      if (buf.front() != c.size() || buf.back() != c.size()) throw Error("wrong all-reduce sum");
      const int iters = static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / bytes, 5, 200));
      c.barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) c.all_reduce(buf.data(), buf.size(), DType::F32).wait();
      double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      comm::AllReduceOptions slowest;
      slowest.op = comm::ReduceOp::Max;
      c.all_reduce(&s, 1, DType::F64, slowest).wait();
      const double busbw = bytes / s * 2.0 * (c.size() - 1) / c.size() / 1e9;
      if (c.rank() == 0) std::printf("%10zu bytes %10.1f us %8.2f GB/s\n", bytes, s * 1e6, busbw);
    }
  });
}
