// bench_comm: in one run, the figures behind the speed targets.
//   1. memory bandwidth (memcpy, 1 and 2 threads): the physical limit of the inproc transport;
//   2. inproc all_reduce with 2 thread-ranks, 4 B .. 256 MiB;
//   3. MPI backend all_reduce and 4. raw MPI_Allreduce (same sizes, same buffers, timed
//      interleaved iteration by iteration).
// Run under `mpirun -np 2` (bench/comm/run.sh). Phases 1-2 run on MPI rank 0 while rank 1 sleeps,
// so the two cores are free for the two threads. Without mpirun only phases 1-2 run.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <thread>

#include "tessera/comm/bench.h"
#include "tessera/comm/inproc/world.h"
#include "tessera/comm/launch.h"

using namespace tessera;
using namespace tessera::comm;

namespace {

struct Summary {
  std::map<size_t, double> us, busbw;
};

Summary summarize(const std::vector<BenchRow>& rows) {
  Summary s;
  for (auto& r : rows) {
    s.us[r.bytes] = r.median_us;
    s.busbw[r.bytes] = r.busbw_gbs;
  }
  return s;
}

// Rank 1 waits for rank 0 without spinning, so it does not steal a core.
void sleepy_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::vector<BenchRow> inproc_table(const BenchOptions& o, int ranks) {
  std::vector<BenchRow> rows;
  CommOptions co;
  co.timeout = std::chrono::seconds(120);
  run_inproc(
      ranks,
      [&](Communicator& c) {
        auto r = bench_collectives(c, o, c.rank() == 0 ? &std::cout : nullptr);
        if (c.rank() == 0) rows = r;
      },
      co);
  return rows;
}

// The MPI backend's all_reduce and raw MPI_Allreduce, interleaved iteration by iteration (which
// one goes first alternates) on the same rotating buffers, so that both see the same machine:
// on a shared host, timing one table after the other let load drift decide the ratio.
void paired_mpi_tables(Communicator& comm, const BenchOptions& o, Summary& backend, Summary& raw) {
  int n = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (me == 0)
    std::cout << "# MPI backend all_reduce and raw MPI_Allreduce (MPI_FLOAT, MPI_SUM), "
                 "interleaved\n";
  {
    float x = 1.0f;  // settle, as bench_collectives does
    for (int i = 0; i < 2000; ++i) comm.all_reduce(&x, 1, DType::F32).wait();
  }
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const size_t elems = std::max<size_t>(bytes / 4, 1);
    const int nbuf = static_cast<int>(std::clamp<size_t>(o.rotate_bytes / (2 * bytes), 2, 64));
    std::vector<std::vector<float>> s(nbuf, std::vector<float>(elems)),
        r(nbuf, std::vector<float>(elems));
    for (auto& b : s)
      for (size_t i = 0; i < elems; ++i)
        b[i] = static_cast<float>(me + 1 + static_cast<int>(i % 5));
    auto run_backend = [&](int i) {
      comm.all_reduce(s[i % nbuf].data(), r[i % nbuf].data(), elems, DType::F32).wait();
    };
    auto run_raw = [&](int i) {
      MPI_Allreduce(s[i % nbuf].data(), r[i % nbuf].data(), static_cast<int>(elems), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
    };
    auto check = [&]() {
      int ok = 1;
      for (size_t i = 0; i < elems && ok; ++i)
        if (r[0][i] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 5))) ok = 0;
      std::fill(r[0].begin(), r[0].end(), 0.0f);
      MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      return ok != 0;
    };
    run_backend(0);
    const bool ok_backend = check();
    run_raw(0);
    const bool ok_raw = check();
    const int iters = bench_iters(o, bytes);
    const int warm = bytes > (size_t{16} << 20) ? std::min(o.warmup, 2) : o.warmup;
    std::vector<int64_t> tb(iters), tr(iters);
    for (int i = 0; i < warm + iters; ++i) {
      for (int k = 0; k < 2; ++k) {
        const bool backend_turn = (k == 0) == (i % 2 == 0);
        comm.barrier().wait();
        const auto t0 = std::chrono::steady_clock::now();
        if (backend_turn)
          run_backend(2 * i + 1);
        else
          run_raw(2 * i + 2);
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        if (i >= warm) (backend_turn ? tb : tr)[i - warm] = ns;
      }
    }
    auto median_us = [&](std::vector<int64_t>& v) {
      AllReduceOptions mx;
      mx.op = ReduceOp::Max;  // an iteration takes as long as its slowest rank
      comm.all_reduce(v.data(), v.size(), DType::I64, mx).wait();
      std::sort(v.begin(), v.end());
      return static_cast<double>(v[v.size() / 2]) / 1000.0;
    };
    for (int which = 0; which < 2; ++which) {
      BenchRow row;
      row.op = which == 0 ? "all_reduce" : "mpi_allreduce";
      row.bytes = elems * 4;
      row.elements = elems;
      row.ok = which == 0 ? ok_backend : ok_raw;
      row.median_us = median_us(which == 0 ? tb : tr);
      row.algbw_gbs = row.bytes / (row.median_us * 1e3);
      row.busbw_gbs = row.algbw_gbs * bus_factor("all_reduce", n);
      Summary& sum = which == 0 ? backend : raw;
      sum.us[row.bytes] = row.median_us;
      sum.busbw[row.bytes] = row.busbw_gbs;
      if (me == 0) std::cout << bench_row_str(row) << std::flush;
    }
    if (bytes > o.max_bytes / 2) break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  o.ops = {"all_reduce"};
  o.min_iters = 15;  // medians of at least 15 iterations: this machine is shared and noisy
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--max-bytes" && i + 1 < argc)
      o.max_bytes = std::stoull(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      o.iters = std::stoi(argv[++i]);
    else if (a == "--min-iters" && i + 1 < argc)
      o.min_iters = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: bench_comm [--max-bytes N] [--iters N] [--min-iters N] (run via "
                   "bench/comm/run.sh)\n");
      return 2;
    }
  }
  const bool mpi = launched_by_mpi() && mpi_available();
  std::unique_ptr<Communicator> world;
  if (mpi) world = mpi_world();  // initialises MPI (MPI_THREAD_MULTIPLE)
  const int me = world ? world->rank() : 0;
  const int n = world ? world->size() : 2;

  double bw1 = 0, bw2 = 0;
  Summary in;
  if (me == 0) {
    std::cout << "# bench_comm: 2026-11-29 build, " << n << " ranks\n";
    bw1 = measure_memcpy_gbs();
    bw2 = measure_memcpy_gbs_threads(n);
    std::cout << "# memory bandwidth, memcpy of 256 MiB (bytes copied per second): 1 thread " << bw1
              << " GB/s, " << n << " threads " << bw2 << " GB/s\n";
    in = summarize(inproc_table(o, n));
  }
  Summary mb, raw;
  if (mpi) {
    sleepy_barrier();  // rank 1 slept through phases 1-2
    paired_mpi_tables(*world, o, mb, raw);
  }
  if (me != 0) return 0;

  std::printf("\n# summary (%d ranks)\n", n);
  double small_max = 0;
  for (auto& [b, us] : in.us)
    if (b <= 1024) small_max = std::max(small_max, us);
  std::printf("inproc all_reduce 4 B..1 KiB: max of medians %.2f us (target < 5 us): %s\n",
              small_max, small_max < 5 ? "met" : "NOT met");
  std::printf("%12s %12s %12s %12s %10s %10s %10s\n", "bytes", "inproc_busbw", "mpi_busbw",
              "raw_busbw", "inproc/mpi", "mpi/raw_t", "inproc/bw1");
  for (auto& [b, bus] : in.busbw) {
    if (b < (size_t{1} << 20)) continue;
    double m = mb.busbw.count(b) ? mb.busbw[b] : 0, r = raw.busbw.count(b) ? raw.busbw[b] : 0;
    double tr = raw.us.count(b) && raw.us[b] > 0 ? mb.us[b] / raw.us[b] : 0;
    std::printf("%12zu %12.3f %12.3f %12.3f %10.2f %10.3f %10.2f\n", b, bus, m, r,
                m > 0 ? bus / m : 0, tr, bw1 > 0 ? bus / bw1 : 0);
  }
  return 0;
}
