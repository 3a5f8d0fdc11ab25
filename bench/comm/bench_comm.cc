// bench_comm: in one run, the figures behind docs/PERFORMANCE.md ("Collectives", "Point to point
// and all_to_allv").
//   1. memory bandwidth (memcpy, 1 and 2 threads): the physical limit of the inproc transport;
//   2. inproc tables with 2 thread-ranks, 4 B .. 256 MiB, for each op of --ops;
//   3. for each op, the MPI backend and raw MPI (same sizes, same buffers, timed interleaved
//      iteration by iteration): all_reduce against MPI_Allreduce, send_recv against MPI_Sendrecv
//      (ping-pong: MPI_PROC_NULL for the skipped half, as send_recv's -1), all_to_allv against
//      MPI_Alltoallv (the same uneven counts, alltoallv_count).
// Run under `mpirun -np 2` (bench/comm/run.sh). Phases 1-2 run on MPI rank 0 while rank 1 sleeps,
// so the two cores are free for the two threads. Without mpirun only phases 1-2 run.
// --mpi-only skips phases 1-2; --ring-segment-bytes N sets CommOptions::ring_segment_bytes of
// both backends (the ring all-reduce's segments). bench/comm/alltoallv_compare.sh repeats the
// all_to_allv comparison for several binaries, optionally under an artificial load.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "tessera/comm/bench.h"
#include "tessera/comm/inproc/world.h"
#include "tessera/comm/launch.h"

using namespace tessera;
using namespace tessera::comm;

namespace {

using Clock = std::chrono::steady_clock;

struct Summary {
  std::map<size_t, double> us, algbw, busbw;
  void add(const BenchRow& r) {
    us[r.bytes] = r.median_us;
    algbw[r.bytes] = r.algbw_gbs;
    busbw[r.bytes] = r.busbw_gbs;
  }
};

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

std::map<std::string, Summary> inproc_tables(const BenchOptions& o, int ranks, CommOptions co) {
  std::map<std::string, Summary> out;
  co.timeout = std::chrono::seconds(120);
  run_inproc(
      ranks,
      [&](Communicator& c) {
        auto rows = bench_collectives(c, o, c.rank() == 0 ? &std::cout : nullptr);
        if (c.rank() == 0)
          for (auto& r : rows) out[r.op].add(r);
      },
      co);
  return out;
}

// Times backend(i) and raw(i) interleaved iteration by iteration (which one goes first
// alternates), each after a barrier, so that both see the same machine: on a shared host, timing
// one table after the other let load drift decide the ratio. Returns the medians, in
// microseconds, of the per-iteration maximum over ranks.
std::pair<double, double> time_interleaved(Communicator& comm, int warm, int iters,
                                           const std::function<void(int)>& backend,
                                           const std::function<void(int)>& raw) {
  std::vector<int64_t> tb(iters), tr(iters);
  for (int i = 0; i < warm + iters; ++i) {
    for (int k = 0; k < 2; ++k) {
      const bool backend_turn = (k == 0) == (i % 2 == 0);
      comm.barrier().wait();
      const auto t0 = Clock::now();
      if (backend_turn)
        backend(2 * i + 1);
      else
        raw(2 * i + 2);
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
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
  const double b = median_us(tb);
  return {b, median_us(tr)};
}

bool all_ok(bool mine) {
  int ok = mine ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok != 0;
}

// One op: for every size, buffers rotating through o.rotate_bytes, a correctness check of both
// variants, then interleaved timing; prints and records a row for each.
struct PairedOp {
  std::string backend_name, raw_name, bus_op;
  double time_divisor = 1;  // 2 for a ping-pong: one way
  // For `elems` elements: allocates nbuf buffer pairs and returns the per-size runner.
  struct Sized {
    std::function<void(int)> backend, raw;
    std::function<bool()> check;  // of buffer pair 0, after run(0); clears it
  };
  std::function<Sized(size_t elems, int nbuf)> setup;
};

void run_paired(Communicator& comm, const BenchOptions& o, const PairedOp& op, Summary& backend,
                Summary& raw) {
  const int n = comm.size(), me = comm.rank();
  if (me == 0)
    std::cout << "# MPI backend " << op.backend_name << " and raw " << op.raw_name
              << " (F32), interleaved\n";
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const size_t elems = std::max<size_t>(bytes / 4, 1);
    const int nbuf = static_cast<int>(std::clamp<size_t>(o.rotate_bytes / (2 * bytes), 2, 64));
    PairedOp::Sized s = op.setup(elems, nbuf);
    s.backend(0);
    const bool ok_backend = all_ok(s.check());
    s.raw(0);
    const bool ok_raw = all_ok(s.check());
    const int iters = bench_iters(o, bytes);
    const int warm = bytes > (size_t{16} << 20) ? std::min(o.warmup, 2) : o.warmup;
    auto [tb, tr] = time_interleaved(comm, warm, iters, s.backend, s.raw);
    for (int which = 0; which < 2; ++which) {
      BenchRow row;
      row.op = which == 0 ? op.backend_name : op.raw_name;
      row.bytes = elems * 4;
      row.elements = elems;
      row.ok = which == 0 ? ok_backend : ok_raw;
      row.median_us = (which == 0 ? tb : tr) / op.time_divisor;
      row.algbw_gbs = row.bytes / (row.median_us * 1e3);
      row.busbw_gbs = row.algbw_gbs * bus_factor(op.bus_op, n);
      (which == 0 ? backend : raw).add(row);
      if (me == 0) std::cout << bench_row_str(row) << std::flush;
    }
    if (bytes > o.max_bytes / 2) break;
  }
}

float pattern(int rank, size_t i) {
  return static_cast<float>(rank + 1 + static_cast<int>(i % 5));
}

PairedOp all_reduce_op(Communicator& comm) {
  PairedOp op{"all_reduce", "mpi_allreduce", "all_reduce", 1, {}};
  const int n = comm.size(), me = comm.rank();
  op.setup = [&comm, n, me](size_t elems, int nbuf) {
    auto s = std::make_shared<std::vector<std::vector<float>>>(nbuf, std::vector<float>(elems));
    auto r = std::make_shared<std::vector<std::vector<float>>>(nbuf, std::vector<float>(elems));
    for (auto& b : *s)
      for (size_t i = 0; i < elems; ++i) b[i] = pattern(me, i);
    PairedOp::Sized z;
    z.backend = [&comm, s, r, elems, nbuf](int i) {
      comm.all_reduce((*s)[i % nbuf].data(), (*r)[i % nbuf].data(), elems, DType::F32).wait();
    };
    z.raw = [s, r, elems, nbuf](int i) {
      MPI_Allreduce((*s)[i % nbuf].data(), (*r)[i % nbuf].data(), static_cast<int>(elems),
                    MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    z.check = [r, elems, n] {
      bool ok = true;
      for (size_t i = 0; i < elems && ok; ++i)
        ok = (*r)[0][i] == static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 5));
      std::fill((*r)[0].begin(), (*r)[0].end(), 0.0f);
      return ok;
    };
    return z;
  };
  return op;
}

// Ping-pong between ranks 0 and 1: rank 0 sends and receives the echo; one way = half.
PairedOp send_recv_op(Communicator& comm) {
  PairedOp op{"send_recv", "mpi_sendrecv", "send_recv", 2, {}};
  const int me = comm.rank();
  op.setup = [&comm, me](size_t elems, int nbuf) {
    auto s = std::make_shared<std::vector<std::vector<float>>>(nbuf, std::vector<float>(elems));
    auto r = std::make_shared<std::vector<std::vector<float>>>(nbuf, std::vector<float>(elems));
    for (auto& b : *s)
      for (size_t i = 0; i < elems; ++i) b[i] = pattern(me, i);
    const int count = static_cast<int>(elems);
    PairedOp::Sized z;
    z.backend = [&comm, s, r, elems, nbuf, me](int i) {
      float* sb = (*s)[i % nbuf].data();
      float* rb = (*r)[i % nbuf].data();
      if (me == 0) {
        comm.send_recv(sb, elems, 1, nullptr, 0, -1, DType::F32).wait();
        comm.send_recv(nullptr, 0, -1, rb, elems, 1, DType::F32).wait();
      } else if (me == 1) {
        comm.send_recv(nullptr, 0, -1, rb, elems, 0, DType::F32).wait();
        comm.send_recv(rb, elems, 0, nullptr, 0, -1, DType::F32).wait();
      }
    };
    z.raw = [s, r, count, nbuf, me](int i) {
      float* sb = (*s)[i % nbuf].data();
      float* rb = (*r)[i % nbuf].data();
      if (me == 0) {
        MPI_Sendrecv(sb, count, MPI_FLOAT, 1, 0, nullptr, 0, MPI_FLOAT, MPI_PROC_NULL, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(nullptr, 0, MPI_FLOAT, MPI_PROC_NULL, 0, rb, count, MPI_FLOAT, 1, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (me == 1) {
        MPI_Sendrecv(nullptr, 0, MPI_FLOAT, MPI_PROC_NULL, 0, rb, count, MPI_FLOAT, 0, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(rb, count, MPI_FLOAT, 0, 0, nullptr, 0, MPI_FLOAT, MPI_PROC_NULL, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      }
    };
    z.check = [r, elems, me] {
      bool ok = true;
      if (me <= 1)  // both hold rank 0's message: rank 1 received it, rank 0 the echo
        for (size_t i = 0; i < elems && ok; ++i) ok = (*r)[0][i] == pattern(0, i);
      std::fill((*r)[0].begin(), (*r)[0].end(), 0.0f);
      return ok;
    };
    return z;
  };
  return op;
}

PairedOp all_to_allv_op(Communicator& comm) {
  PairedOp op{"all_to_allv", "mpi_alltoallv", "all_to_allv", 1, {}};
  const int n = comm.size(), me = comm.rank();
  op.setup = [&comm, n, me](size_t elems, int nbuf) {
    std::vector<size_t> sc(n), rc(n), src_off(n);
    std::vector<int> isc(n), irc(n), isd(n), ird(n);
    size_t rtotal = 0;
    for (int j = 0; j < n; ++j) {
      sc[j] = alltoallv_count(me, j, n, elems);
      rc[j] = alltoallv_count(j, me, n, elems);
      for (int k = 0; k < me; ++k) src_off[j] += alltoallv_count(j, k, n, elems);
      isc[j] = static_cast<int>(sc[j]);
      irc[j] = static_cast<int>(rc[j]);
      isd[j] = j ? isd[j - 1] + isc[j - 1] : 0;
      ird[j] = j ? ird[j - 1] + irc[j - 1] : 0;
      rtotal += rc[j];
    }
    auto s = std::make_shared<std::vector<std::vector<float>>>(nbuf, std::vector<float>(elems));
    auto r = std::make_shared<std::vector<std::vector<float>>>(
        nbuf, std::vector<float>(std::max<size_t>(rtotal, 1)));
    for (auto& b : *s)
      for (size_t i = 0; i < elems; ++i) b[i] = pattern(me, i);
    PairedOp::Sized z;
    z.backend = [&comm, s, r, sc, rc, nbuf](int i) {
      comm.all_to_allv((*s)[i % nbuf].data(), sc, (*r)[i % nbuf].data(), rc, DType::F32).wait();
    };
    z.raw = [s, r, isc, isd, irc, ird, nbuf](int i) {
      MPI_Alltoallv((*s)[i % nbuf].data(), isc.data(), isd.data(), MPI_FLOAT, (*r)[i % nbuf].data(),
                    irc.data(), ird.data(), MPI_FLOAT, MPI_COMM_WORLD);
    };
    z.check = [r, rc, src_off, n] {
      bool ok = true;
      size_t at = 0;
      for (int j = 0; j < n && ok; ++j)
        for (size_t e = 0; e < rc[j] && ok; ++e) ok = (*r)[0][at++] == pattern(j, src_off[j] + e);
      std::fill((*r)[0].begin(), (*r)[0].end(), 0.0f);
      return ok;
    };
    return z;
  };
  return op;
}

void print_ratio_table(const char* title, const Summary& in, const Summary& mb, const Summary& raw,
                       bool bus, double bw1) {
  std::printf("%s\n", title);
  std::printf("%12s %12s %12s %12s %10s %10s %10s\n", "bytes", bus ? "inproc_busbw" : "inproc_GB/s",
              bus ? "mpi_busbw" : "mpi_GB/s", bus ? "raw_busbw" : "raw_GB/s", "inproc/mpi",
              "mpi/raw_t", "inproc/bw1");
  std::set<size_t> sizes;  // with --mpi-only there are no inproc rows
  for (const Summary* s : {&in, &mb})
    for (auto& [b, us] : s->us) sizes.insert(b);
  for (size_t b : sizes) {
    if (b < (size_t{1} << 20)) continue;
    auto get = [&](const Summary& s) {
      const auto& m = bus ? s.busbw : s.algbw;
      auto it = m.find(b);
      return it == m.end() ? 0.0 : it->second;
    };
    const double x = get(in), m = get(mb), r = get(raw);
    const double tr = raw.us.count(b) && raw.us.at(b) > 0 ? mb.us.at(b) / raw.us.at(b) : 0;
    std::printf("%12zu %12.3f %12.3f %12.3f %10.2f %10.3f %10.2f\n", b, x, m, r, m > 0 ? x / m : 0,
                tr, bw1 > 0 ? x / bw1 : 0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  o.ops = {"all_reduce", "send_recv", "all_to_allv"};
  o.min_iters = 15;  // medians of at least 15 iterations: this machine is shared and noisy
  CommOptions co;
  bool mpi_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mpi-only") {
      mpi_only = true;
    } else if (a == "--ring-segment-bytes" && i + 1 < argc) {
      co.ring_segment_bytes = std::stoull(argv[++i]);
    } else if (a == "--max-bytes" && i + 1 < argc) {
      o.max_bytes = std::stoull(argv[++i]);
    } else if (a == "--min-bytes" && i + 1 < argc) {
      o.min_bytes = std::stoull(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      o.iters = std::stoi(argv[++i]);
    } else if (a == "--min-iters" && i + 1 < argc) {
      o.min_iters = std::stoi(argv[++i]);
    } else if (a == "--ops" && i + 1 < argc) {
      o.ops.clear();
      std::stringstream ss(argv[++i]);
      for (std::string op; std::getline(ss, op, ',');) {
        if (op != "all_reduce" && op != "send_recv" && op != "all_to_allv") {
          std::fprintf(stderr, "bench_comm: --ops takes all_reduce, send_recv, all_to_allv\n");
          return 2;
        }
        o.ops.push_back(op);
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_comm [--ops all_reduce,send_recv,all_to_allv] [--min-bytes N] "
                   "[--max-bytes N] [--iters N] [--min-iters N] [--mpi-only] "
                   "[--ring-segment-bytes N] (run via bench/comm/run.sh)\n");
      return 2;
    }
  }
  const bool mpi = launched_by_mpi() && mpi_available();
  std::unique_ptr<Communicator> world;
  if (mpi) world = mpi_world(co);  // initialises MPI (MPI_THREAD_MULTIPLE)
  const int me = world ? world->rank() : 0;
  const int n = world ? world->size() : 2;

  double bw1 = 0, bw2 = 0;
  std::map<std::string, Summary> in;
  if (me == 0) std::cout << "# bench_comm: " << n << " ranks\n";
  if (me == 0 && !(mpi && mpi_only)) {
    bw1 = measure_memcpy_gbs();
    bw2 = measure_memcpy_gbs_threads(n);
    std::cout << "# memory bandwidth, memcpy of 256 MiB (bytes copied per second): 1 thread " << bw1
              << " GB/s, " << n << " threads " << bw2 << " GB/s\n";
    in = inproc_tables(o, n, co);
  }
  std::map<std::string, Summary> mb, raw;
  if (mpi) {
    sleepy_barrier();  // rank 1 slept through phases 1-2
    {
      float x = 1.0f;  // settle, as bench_collectives does
      for (int i = 0; i < 2000; ++i) world->all_reduce(&x, 1, DType::F32).wait();
    }
    for (const std::string& name : o.ops) {
      const PairedOp op = name == "all_reduce"  ? all_reduce_op(*world)
                          : name == "send_recv" ? send_recv_op(*world)
                                                : all_to_allv_op(*world);
      run_paired(*world, o, op, mb[name], raw[name]);
    }
  }
  if (me != 0) return 0;

  std::printf("\n# summary (%d ranks)\n", n);
  for (const std::string& name : o.ops) {
    if (name == "all_reduce") {
      double small_max = 0;
      for (auto& [b, us] : in[name].us)
        if (b <= 1024) small_max = std::max(small_max, us);
      if (!in[name].us.empty())
        std::printf("inproc all_reduce 4 B..1 KiB: max of medians %.2f us (target < 5 us): %s\n",
                    small_max, small_max < 5 ? "met" : "NOT met");
      print_ratio_table("all_reduce busbw (GB/s)", in[name], mb[name], raw[name], true, bw1);
    } else if (name == "send_recv") {
      auto lat = [&](std::map<std::string, Summary>& m) {
        auto& us = m[name].us;
        return us.count(4) ? us.at(4) : 0.0;
      };
      std::printf(
          "send_recv one-way latency at 4 B (us): inproc %.2f, MPI backend %.2f, raw "
          "MPI_Sendrecv %.2f\n",
          lat(in), lat(mb), lat(raw));
      print_ratio_table("send_recv one-way GB/s (ping-pong)", in[name], mb[name], raw[name], false,
                        bw1);
    } else {
      print_ratio_table("all_to_allv busbw (GB/s)", in[name], mb[name], raw[name], true, bw1);
    }
  }
  return 0;
}
