#include "tessera/comm/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>

namespace tessera::comm {
namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string>& all_ops() {
  static const std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter",
                                               "broadcast",  "all_to_all", "all_to_allv",
                                               "send_recv"};
  return ops;
}

// Element i of `buf` as a double / from a double.
double load(const void* buf, size_t i, DType t) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(buf)[i];
    case DType::F64:
      return static_cast<const double*>(buf)[i];
    case DType::I32:
      return static_cast<const int32_t*>(buf)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::BF16:
      return from_bf16(static_cast<const bf16*>(buf)[i]);
    default:
      return 0;
  }
}
void store(void* buf, size_t i, DType t, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DType::F64:
      static_cast<double*>(buf)[i] = v;
      break;
    case DType::I32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DType::I64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case DType::BF16:
      static_cast<bf16*>(buf)[i] = to_bf16(static_cast<float>(v));
      break;
    default:
      break;
  }
}
// Small integers: exact in every supported dtype for the world sizes we run.
double value(int rank, size_t i) {
  return static_cast<double>(rank + 1 + static_cast<int>(i % 5));
}

struct Buffer {
  std::unique_ptr<unsigned char[]> mem;
  unsigned char* p = nullptr;
  explicit Buffer(size_t bytes) : mem(new unsigned char[bytes + 64]) {
    auto a = reinterpret_cast<uintptr_t>(mem.get());
    p = reinterpret_cast<unsigned char*>((a + 63) / 64 * 64);
    std::memset(p, 0, bytes);  // touch every page before timing
  }
};

}  // namespace

std::vector<std::string> parse_bench_ops(const std::string& csv) {
  if (csv.empty() || csv == "all") return all_ops();
  std::vector<std::string> out;
  std::stringstream ss(csv);
  std::string op;
  while (std::getline(ss, op, ',')) {
    if (std::find(all_ops().begin(), all_ops().end(), op) == all_ops().end())
      throw ConfigError("unknown op '" + op +
                        "' (expected all or a comma-separated list of all_reduce, all_gather, "
                        "reduce_scatter, broadcast, all_to_all, all_to_allv, send_recv)");
    out.push_back(op);
  }
  return out;
}

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast" || op == "send_recv") return 1.0;
  return static_cast<double>(n - 1) / n;
}

size_t alltoallv_count(int from, int to, int n, size_t elems) {
  auto weight = [](int i, int j) {
    const uint32_t h =
        (static_cast<uint32_t>(i) * 31u + static_cast<uint32_t>(j) * 17u + 7u) * 2654435761u;
    return static_cast<size_t>(1 + (h >> 28) % 8);
  };
  size_t total = 0, before = 0;
  for (int j = 0; j < n; ++j) total += weight(from, j);
  for (int j = 0; j < to; ++j) before += elems * weight(from, j) / total;
  if (to == n - 1) return elems - before;
  return elems * weight(from, to) / total;
}

int bench_iters(const BenchOptions& opts, size_t bytes) {
  const size_t mib = size_t{1} << 20;
  if (bytes <= mib) return opts.iters;
  return std::max<int>(opts.min_iters, static_cast<int>(opts.iters * mib / bytes));
}

double time_collective_us(Communicator& comm, int warmup, int iters,
                          const std::function<void(int)>& run) {
  std::vector<int64_t> ns(std::max(iters, 1), 0);
  for (int i = 0; i < warmup + iters; ++i) {
    comm.barrier().wait();
    auto t0 = Clock::now();
    run(i);
    auto t1 = Clock::now();
    if (i >= warmup)
      ns[i - warmup] = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  }
  AllReduceOptions o;
  o.op = ReduceOp::Max;
  comm.all_reduce(ns.data(), ns.size(), DType::I64, o).wait();
  std::sort(ns.begin(), ns.begin() + iters);
  if (iters <= 0) return 0;
  double med = iters % 2 ? static_cast<double>(ns[iters / 2])
                         : 0.5 * static_cast<double>(ns[iters / 2 - 1] + ns[iters / 2]);
  return med / 1000.0;
}

std::string bench_header(const Communicator& comm, const BenchOptions& opts) {
  std::ostringstream os;
  os << "# tessera bench-comm: backend " << comm.backend() << ", " << comm.size()
     << " ranks, dtype " << dtype_name(opts.dtype) << ", all_reduce algorithm "
     << algorithm_name(opts.algorithm) << ", iters " << opts.iters
     << " (fewer above 1 MiB, at least " << opts.min_iters << "), warmup " << opts.warmup << "\n"
     << "# time: median over iterations of the slowest rank; GB/s = 1e9 bytes/s\n";
  if (std::find(opts.ops.begin(), opts.ops.end(), "send_recv") != opts.ops.end())
    os << "# send_recv: ping-pong between ranks 0 and 1; time = one way (half the round trip)\n";
  char line[160];
  std::snprintf(line, sizeof line, "%-15s %12s %12s %12s %12s %12s %6s\n", "# op", "bytes",
                "elements", "time_us", "algbw_GB/s", "busbw_GB/s", "check");
  os << line;
  return os.str();
}

std::string bench_row_str(const BenchRow& r) {
  char line[200];
  std::snprintf(line, sizeof line, "%-15s %12zu %12zu %12.2f %12.3f %12.3f %6s\n", r.op.c_str(),
                r.bytes, r.elements, r.median_us, r.algbw_gbs, r.busbw_gbs, r.ok ? "ok" : "FAIL");
  return line;
}

std::vector<BenchRow> bench_collectives(Communicator& comm, const BenchOptions& opts,
                                        std::ostream* out) {
  const int n = comm.size(), me = comm.rank();
  const DType t = opts.dtype;
  const size_t es = dtype_size(t);
  std::vector<BenchRow> rows;
  if (out) *out << bench_header(comm, opts) << std::flush;
  // Settle first: every rank's threads running and its first pages touched, so the first
  // (smallest) size is not timed against a peer that is still starting up.
  {
    float x = 1.0f;
    for (int i = 0; i < 2000; ++i) comm.all_reduce(&x, 1, DType::F32).wait();
  }
  for (const std::string& op : opts.ops) {
    if (op == "send_recv" && n < 2) {
      if (out) *out << "# send_recv: a ping-pong needs 2 ranks; skipped\n";
      continue;
    }
    const bool per_rank = op == "all_gather" || op == "reduce_scatter" || op == "all_to_all";
    for (size_t bytes = std::max<size_t>(opts.min_bytes, es); bytes <= opts.max_bytes; bytes *= 2) {
      // Elements of the large buffer; ops with per-rank blocks need a multiple of n.
      size_t elems = bytes / es;
      if (per_rank) elems = std::max<size_t>(elems / n, 1) * n;
      const size_t block = per_rank ? elems / n : elems;
      size_t send_elems = elems, recv_elems = elems;
      if (op == "all_gather") send_elems = block;
      if (op == "reduce_scatter") recv_elems = block;
      // all_to_allv: this rank's counts, and where its block starts in each sender's buffer.
      std::vector<size_t> sc(n), rc(n), src_off(n);
      if (op == "all_to_allv") {
        recv_elems = 0;
        for (int j = 0; j < n; ++j) {
          sc[j] = alltoallv_count(me, j, n, elems);
          rc[j] = alltoallv_count(j, me, n, elems);
          recv_elems += rc[j];
          for (int k = 0; k < me; ++k) src_off[j] += alltoallv_count(j, k, n, elems);
        }
      }
      const size_t pair = (send_elems + recv_elems) * es;
      const int nbuf = static_cast<int>(
          std::clamp<size_t>(opts.rotate_bytes / std::max<size_t>(pair, 1), 2, 64));
      std::vector<Buffer> sends, recvs;
      for (int b = 0; b < nbuf; ++b) {
        sends.emplace_back(send_elems * es);
        recvs.emplace_back(recv_elems * es);
        for (size_t i = 0; i < send_elems; ++i) store(sends.back().p, i, t, value(me, i));
      }
      auto run = [&](int i) {
        void* s = sends[i % nbuf].p;
        void* r = recvs[i % nbuf].p;
        if (op == "all_reduce") {
          AllReduceOptions o;
          o.algorithm = opts.algorithm;
          comm.all_reduce(s, r, elems, t, o).wait();
        } else if (op == "all_gather") {
          comm.all_gather(s, r, block, t).wait();
        } else if (op == "reduce_scatter") {
          comm.reduce_scatter(s, r, block, t).wait();
        } else if (op == "broadcast") {
          comm.broadcast(s, elems, t).wait();  // in place: root 0's pattern
        } else if (op == "all_to_all") {
          comm.all_to_all(s, r, block, t).wait();
        } else if (op == "all_to_allv") {
          comm.all_to_allv(s, sc, r, rc, t).wait();
        } else if (me == 0) {  // send_recv ping-pong
          comm.send_recv(s, elems, 1, nullptr, 0, -1, t).wait();
          comm.send_recv(nullptr, 0, -1, r, elems, 1, t).wait();
        } else if (me == 1) {  // echoes what it received
          comm.send_recv(nullptr, 0, -1, r, elems, 0, t).wait();
          comm.send_recv(r, elems, 0, nullptr, 0, -1, t).wait();
        }
      };
      // Correctness first.
      run(0);
      int32_t ok = 1;
      const void* res = op == "broadcast" ? sends[0].p : recvs[0].p;
      for (size_t i = 0; i < recv_elems && ok; ++i) {
        double want = 0;
        if (op == "all_reduce") {
          for (int r = 0; r < n; ++r) want += value(r, i);
        } else if (op == "all_gather") {
          want = value(static_cast<int>(i / block), i % block);
        } else if (op == "reduce_scatter") {
          for (int r = 0; r < n; ++r) want += value(r, me * block + i);
        } else if (op == "broadcast") {
          want = value(0, i);
        } else if (op == "all_to_all") {
          want = value(static_cast<int>(i / block), me * block + i % block);
        } else if (op == "all_to_allv") {
          size_t off = i;
          int j = 0;
          while (off >= rc[j]) off -= rc[j++];
          want = value(j, src_off[j] + off);
        } else {
          if (me > 1) break;   // not in the ping-pong
          want = value(0, i);  // rank 1 received rank 0's message and sent it back
        }
        if (load(res, i, t) != want) ok = 0;
      }
      // Broadcast overwrote the pattern on non-roots; the timed runs do not need it back.
      AllReduceOptions mn;
      mn.op = ReduceOp::Min;
      comm.all_reduce(&ok, 1, DType::I32, mn).wait();
      const int iters = bench_iters(opts, bytes);
      const int warm = bytes > (size_t{16} << 20) ? std::min(opts.warmup, 2) : opts.warmup;
      BenchRow row;
      row.op = op;
      row.bytes = elems * es;
      row.elements = elems;
      row.ok = ok != 0;
      row.median_us = time_collective_us(comm, warm, iters, [&](int i) { run(i + 1); });
      if (op == "send_recv") row.median_us /= 2;  // one way: half the round trip
      row.algbw_gbs = row.median_us > 0 ? row.bytes / (row.median_us * 1e3) : 0;
      row.busbw_gbs = row.algbw_gbs * bus_factor(op, n);
      rows.push_back(row);
      if (out) *out << bench_row_str(row) << std::flush;
      if (bytes > opts.max_bytes / 2) break;  // avoid overflow at the top
    }
  }
  return rows;
}

double measure_memcpy_gbs_threads(int threads, size_t bytes, int reps) {
  std::vector<double> gbs;
  std::vector<std::unique_ptr<Buffer>> src, dst;
  for (int t = 0; t < threads; ++t) {
    src.push_back(std::make_unique<Buffer>(bytes));
    dst.push_back(std::make_unique<Buffer>(bytes));
    std::memset(src.back()->p, 1, bytes);
  }
  for (int r = 0; r < reps + 1; ++r) {
    auto t0 = Clock::now();
    std::vector<std::thread> th;
    for (int t = 1; t < threads; ++t)
      th.emplace_back([&, t] { std::memcpy(dst[t]->p, src[t]->p, bytes); });
    std::memcpy(dst[0]->p, src[0]->p, bytes);
    for (auto& x : th) x.join();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) gbs.push_back(static_cast<double>(bytes) * threads / s / 1e9);
  }
  std::sort(gbs.begin(), gbs.end());
  return gbs[gbs.size() / 2];
}

double measure_memcpy_gbs(size_t bytes, int reps) {
  return measure_memcpy_gbs_threads(1, bytes, reps);
}

}  // namespace tessera::comm
