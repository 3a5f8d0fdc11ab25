// Backend-independent correctness checks (used by test_comm and test_comm_mpi).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "helpers.h"

namespace tessera::comm::test {
namespace {

const DType kDtypes[] = {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min};

// Small integers, exact in every dtype, differing by rank and position.
double value(int rank, size_t i) {
  return static_cast<double>((rank + 1) * static_cast<int>(i % 3 + 1) + static_cast<int>(i % 5));
}

struct Buf {
  DType t;
  std::vector<unsigned char> b;
  Buf(DType t_, size_t n) : t(t_), b(n * dtype_size(t_) + 1) {}
  void* p() { return b.data(); }
  void set(size_t i, double v) {
    switch (t) {
      case DType::F32:
        reinterpret_cast<float*>(p())[i] = static_cast<float>(v);
        break;
      case DType::F64:
        reinterpret_cast<double*>(p())[i] = v;
        break;
      case DType::BF16:
        reinterpret_cast<bf16*>(p())[i] = to_bf16(static_cast<float>(v));
        break;
      case DType::I32:
        reinterpret_cast<int32_t*>(p())[i] = static_cast<int32_t>(v);
        break;
      case DType::I64:
        reinterpret_cast<int64_t*>(p())[i] = static_cast<int64_t>(v);
        break;
      default:
        break;
    }
  }
  double get(size_t i) {
    switch (t) {
      case DType::F32:
        return reinterpret_cast<float*>(p())[i];
      case DType::F64:
        return reinterpret_cast<double*>(p())[i];
      case DType::BF16:
        return from_bf16(reinterpret_cast<bf16*>(p())[i]);
      case DType::I32:
        return reinterpret_cast<int32_t*>(p())[i];
      case DType::I64:
        return static_cast<double>(reinterpret_cast<int64_t*>(p())[i]);
      default:
        return 0;
    }
  }
};

double reduce_expected(ReduceOp op, DType t, int n, const std::function<double(int)>& v) {
  double acc = v(0);
  for (int r = 1; r < n; ++r) {
    double x = v(r);
    acc = op == ReduceOp::Max ? std::max(acc, x) : op == ReduceOp::Min ? std::min(acc, x) : acc + x;
  }
  if (op == ReduceOp::Mean) {
    if (t == DType::I32 || t == DType::I64) return std::trunc(acc / n);
    return acc / n;
  }
  return acc;
}

void expect_eq(double got, double want, DType t, const std::string& what, size_t i) {
  double tol = t == DType::BF16  ? std::abs(want) * 1e-2
               : t == DType::F32 ? std::abs(want) * 1e-6
               : t == DType::F64 ? std::abs(want) * 1e-14
                                 : 0;
  if (std::abs(got - want) > tol) {
    std::ostringstream os;
    os << what << " (" << dtype_name(t) << "): element " << i << " is " << got << ", expected "
       << want;
    throw std::runtime_error(os.str());
  }
}

std::string ctx(const Communicator& c, const char* op, size_t count) {
  std::ostringstream os;
  os << op << " rank " << c.rank() << "/" << c.size() << " count " << count;
  return os.str();
}

}  // namespace

void check_all_reduce(Communicator& c, size_t count, bool full) {
  const int n = c.size(), me = c.rank();
  for (DType t : kDtypes) {
    if (!full && (t == DType::I32 || t == DType::I64)) continue;
    for (ReduceOp op : kOps) {
      if (!full && (op == ReduceOp::Min || op == ReduceOp::Max) && t != DType::F32 &&
          t != DType::F64)
        continue;
      for (bool in_place : {false, true}) {
        for (Algorithm a :
             {Algorithm::Auto, Algorithm::Small, Algorithm::Direct, Algorithm::Ring}) {
          if (!full && a == Algorithm::Small) continue;
          Buf in(t, count), out(t, count);
          for (size_t i = 0; i < count; ++i) in.set(i, value(me, i));
          AllReduceOptions o;
          o.op = op;
          o.algorithm = a;
          o.async = (count % 2) == 1;  // exercise the progress thread too
          Buf& res = in_place ? in : out;
          Work w = in_place ? c.all_reduce(in.p(), count, t, o)
                            : c.all_reduce(in.p(), out.p(), count, t, o);
          w.wait();
          if (!w.is_completed()) throw std::runtime_error("Work not completed after wait()");
          std::string what = ctx(c, "all_reduce", count) + " " + std::string(reduce_op_name(op)) +
                             " " + std::string(algorithm_name(a)) + (in_place ? " in place" : "");
          for (size_t i = 0; i < count; ++i)
            expect_eq(res.get(i), reduce_expected(op, t, n, [&](int r) { return value(r, i); }), t,
                      what, i);
        }
      }
    }
  }
}

void check_all_gather(Communicator& c, size_t count, bool full) {
  const int n = c.size(), me = c.rank();
  for (DType t : kDtypes) {
    if (!full && t != DType::F32 && t != DType::BF16) continue;
    for (bool in_place : {false, true}) {
      Buf in(t, count), out(t, count * n);
      for (size_t i = 0; i < count; ++i) in.set(i, value(me, i));
      if (in_place) {
        for (size_t i = 0; i < count; ++i) out.set(me * count + i, value(me, i));
        c.all_gather(static_cast<unsigned char*>(out.p()) + me * count * dtype_size(t), out.p(),
                     count, t)
            .wait();
      } else {
        c.all_gather(in.p(), out.p(), count, t).wait();
      }
      const std::string w = ctx(c, "all_gather", count);
      for (size_t i = 0; i < count * n; ++i)
        expect_eq(out.get(i), value(static_cast<int>(i / count), i % count), t, w, i);
    }
  }
}

void check_reduce_scatter(Communicator& c, size_t count, bool full) {
  const int n = c.size(), me = c.rank();
  for (DType t : kDtypes) {
    if (!full && t != DType::F32 && t != DType::F64 && t != DType::BF16) continue;
    for (ReduceOp op : kOps) {
      if (!full && op != ReduceOp::Sum && t != DType::F64) continue;
      for (bool in_place : {false, true}) {
        Buf in(t, count * n), out(t, count);
        for (size_t i = 0; i < count * n; ++i) in.set(i, value(me, i));
        ReduceScatterOptions o;
        o.op = op;
        void* dst =
            in_place ? static_cast<unsigned char*>(in.p()) + me * count * dtype_size(t) : out.p();
        c.reduce_scatter(in.p(), dst, count, t, o).wait();
        const std::string w =
            ctx(c, "reduce_scatter", count) + " " + std::string(reduce_op_name(op));
        for (size_t i = 0; i < count; ++i) {
          double got = in_place ? in.get(me * count + i) : out.get(i);
          expect_eq(got, reduce_expected(op, t, n, [&](int r) { return value(r, me * count + i); }),
                    t, w, i);
        }
      }
    }
  }
}

void check_broadcast(Communicator& c, size_t count, bool full) {
  const int n = c.size(), me = c.rank();
  for (DType t : kDtypes) {
    if (!full && t != DType::F32) continue;
    for (int root = 0; root < n; ++root) {
      Buf b(t, count);
      for (size_t i = 0; i < count; ++i) b.set(i, value(me, i));
      BroadcastOptions o;
      o.root = root;
      c.broadcast(b.p(), count, t, o).wait();
      const std::string w = ctx(c, "broadcast", count);
      for (size_t i = 0; i < count; ++i) expect_eq(b.get(i), value(root, i), t, w, i);
    }
  }
}

void check_all_to_all(Communicator& c, size_t count, bool full) {
  const int n = c.size(), me = c.rank();
  for (DType t : kDtypes) {
    if (!full && t != DType::F32) continue;
    for (bool in_place : {false, true}) {
      Buf in(t, count * n), out(t, count * n);
      for (size_t i = 0; i < count * n; ++i) in.set(i, value(me, i));
      Buf& res = in_place ? in : out;
      c.all_to_all(in.p(), res.p(), count, t).wait();
      const std::string w = ctx(c, "all_to_all", count);
      for (size_t j = 0; j < count * n; ++j) {
        const int src = static_cast<int>(j / count);
        expect_eq(res.get(j), value(src, me * count + j % count), t, w, j);
      }
    }
  }
}

void check_all_to_allv(Communicator& c, size_t count) {
  const int n = c.size(), me = c.rank();
  // Rank i sends (count + i + 2*j) % (count + 3) elements to rank j: unequal and sometimes zero.
  // In place needs equal send and receive totals on every rank: a symmetric pattern.
  for (DType t : {DType::F32, DType::I64}) {
    for (bool in_place : {false, true}) {
      auto cnt = [&](int i, int j) {
        return in_place ? (count + i + j) % (count + 3) : (count + i + 2 * j) % (count + 3);
      };
      std::vector<size_t> sc(n), rc(n);
      size_t st = 0, rt = 0;
      for (int j = 0; j < n; ++j) {
        sc[j] = cnt(me, j);
        rc[j] = cnt(j, me);
        st += sc[j];
        rt += rc[j];
      }
      Buf in(t, std::max(st, rt)), out(t, rt);
      for (size_t i = 0; i < st; ++i) in.set(i, value(me, i));
      Buf& res = in_place ? in : out;
      c.all_to_allv(in.p(), sc, res.p(), rc, t).wait();
      size_t off = 0;
      const std::string w = ctx(c, "all_to_allv", count);
      for (int j = 0; j < n; ++j) {
        size_t src_off = 0;
        for (int k = 0; k < me; ++k) src_off += cnt(j, k);
        for (size_t e = 0; e < rc[j]; ++e)
          expect_eq(res.get(off + e), value(j, src_off + e), t, w, off + e);
        off += rc[j];
      }
    }
  }
}

void check_all_to_allv_patterns(Communicator& c, size_t count) {
  const int n = c.size(), me = c.rank();
  // The three count matrices cnt(i, j) = elements rank i sends rank j, the same on every rank:
  // all zero (null buffers are fine then), everything to the last rank, and pseudo-random counts
  // in [0, 2 count + 2] with about a quarter of them zero (a seeded generator every rank runs).
  std::vector<std::vector<size_t>> random(n, std::vector<size_t>(n));
  uint64_t state = 0x9E3779B97F4A7C15ull ^ (count * 1315423911ull) ^ static_cast<uint64_t>(n);
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>(state >> 33);
  };
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) random[i][j] = next() % 4 == 0 ? 0 : next() % (2 * count + 3);
  const std::function<size_t(int, int)> patterns[] = {
      [](int, int) { return size_t{0}; },
      [&](int i, int j) { return j == n - 1 ? count + static_cast<size_t>(i) : 0; },
      [&](int i, int j) { return random[i][j]; }};
  const char* names[] = {"all_to_allv (zero counts)", "all_to_allv (all to the last rank)",
                         "all_to_allv (random counts)"};
  for (int k = 0; k < 3; ++k) {
    const auto& cnt = patterns[k];
    for (DType t : {DType::F32, DType::I32}) {
      std::vector<size_t> sc(n), rc(n);
      size_t st = 0, rt = 0;
      for (int j = 0; j < n; ++j) {
        sc[j] = cnt(me, j);
        rc[j] = cnt(j, me);
        st += sc[j];
        rt += rc[j];
      }
      // The receive counts exchanged from the send counts are what the peers send.
      if (c.exchange_counts(sc) != rc)
        throw std::runtime_error(ctx(c, "exchange_counts", count) + ": wrong receive counts");
      Buf in(t, st), out(t, rt);
      for (size_t i = 0; i < st; ++i) in.set(i, value(me, i));
      const bool empty = st == 0 && rt == 0;
      c.all_to_allv(empty ? nullptr : in.p(), sc, empty ? nullptr : out.p(), rc, t).wait();
      size_t off = 0;
      const std::string w = ctx(c, names[k], count);
      for (int j = 0; j < n; ++j) {
        size_t src_off = 0;
        for (int q = 0; q < me; ++q) src_off += cnt(j, q);
        for (size_t e = 0; e < rc[j]; ++e)
          expect_eq(out.get(off + e), value(j, src_off + e), t, w, off + e);
        off += rc[j];
      }
    }
  }
}

void check_send_recv(Communicator& c, size_t count) {
  const int n = c.size(), me = c.rank();
  if (n == 1) return;
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  for (DType t : kDtypes) {
    Buf a(t, count), b(t, count), got_a(t, count), got_b(t, count);
    for (size_t i = 0; i < count; ++i) {
      a.set(i, value(me, i));
      b.set(i, value(me + 1, i));
    }
    // Two tags, posted in one order and received in the other.
    SendOptions s1, s2;
    s1.tag = 1;
    s2.tag = 2;
    s1.async = s2.async = true;
    Work w1 = c.send(a.p(), count, t, right, s1);
    Work w2 = c.send(b.p(), count, t, right, s2);
    RecvOptions r1, r2;
    r1.tag = 1;
    r2.tag = 2;
    r1.async = r2.async = true;
    Work w4 = c.recv(got_b.p(), count, t, left, r2);
    Work w3 = c.recv(got_a.p(), count, t, left, r1);
    w1.wait();
    w2.wait();
    w3.wait();
    w4.wait();
    const std::string w = ctx(c, "send/recv", count);
    for (size_t i = 0; i < count; ++i) {
      expect_eq(got_a.get(i), value(left, i), t, w, i);
      expect_eq(got_b.get(i), value(left + 1, i), t, w, i);
    }
  }
  c.barrier().wait();
}

}  // namespace tessera::comm::test

namespace tessera::comm::test {

void check_send_recv_exchange(Communicator& c, size_t count) {
  const int n = c.size(), me = c.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  const std::string w = ctx(c, "send_recv", count);
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I64}) {
    // 1. A ring: send to the right, receive from the left (with itself on one rank), synchronous
    //    and on the progress thread.
    for (bool async : {false, true}) {
      Buf out(t, count), in(t, count);
      for (size_t i = 0; i < count; ++i) out.set(i, value(me, i));
      SendRecvOptions o;
      o.async = async;
      o.send_tag = o.recv_tag = 5;
      Work wk = c.send_recv(out.p(), count, right, in.p(), count, left, t, o);
      wk.wait();
      for (size_t i = 0; i < count; ++i) expect_eq(in.get(i), value(left, i), t, w + " ring", i);
    }
    // 2. Pairs exchanging with the same peer (0<->1, 2<->3, ...; an odd rank out exchanges with
    //    itself), with counts that differ by direction.
    {
      const int partner = (me ^ 1) < n ? (me ^ 1) : me;
      const size_t mine = count + static_cast<size_t>(me % 2);
      const size_t theirs = count + static_cast<size_t>(partner % 2);
      Buf out(t, mine), in(t, theirs);
      for (size_t i = 0; i < mine; ++i) out.set(i, value(me, i));
      c.send_recv(out.p(), mine, partner, in.p(), theirs, partner, t).wait();
      for (size_t i = 0; i < theirs; ++i)
        expect_eq(in.get(i), value(partner, i), t, w + " pair", i);
    }
  }
  // 3. A pipeline: activations forward (tag 1), then gradients backward (tag 2); the first and
  //    last stages skip one half with peer -1.
  const int next = me + 1 < n ? me + 1 : -1, prev = me > 0 ? me - 1 : -1;
  Buf act(DType::F32, count), got(DType::F32, count), grad(DType::F32, count),
      dgot(DType::F32, count);
  for (size_t i = 0; i < count; ++i) {
    act.set(i, value(me, i));
    grad.set(i, -value(me, i));
  }
  SendRecvOptions fwd;
  fwd.send_tag = fwd.recv_tag = 1;
  c.send_recv(act.p(), count, next, got.p(), count, prev, DType::F32, fwd).wait();
  SendRecvOptions bwd;
  bwd.send_tag = bwd.recv_tag = 2;
  c.send_recv(grad.p(), count, prev, dgot.p(), count, next, DType::F32, bwd).wait();
  for (size_t i = 0; i < count; ++i) {
    if (prev >= 0) expect_eq(got.get(i), value(prev, i), DType::F32, w + " pipeline fwd", i);
    if (next >= 0) expect_eq(dgot.get(i), -value(next, i), DType::F32, w + " pipeline bwd", i);
  }
  // 4. Nothing to do.
  c.send_recv(nullptr, 0, -1, nullptr, 0, -1, DType::F32).wait();
  // 5. The same messages as send/recv: a plain (eager) send received by send_recv around the
  //    ring, and a send_recv's message taken by a plain recv (rank 0 to rank 1 only: a send_recv
  //    completes when its message is received, so a ring of send-only send_recvs followed by
  //    recvs would wait on itself, as MPI_Ssend would).
  if (n > 1) {
    Buf a(DType::I32, count), b(DType::I32, count);
    for (size_t i = 0; i < count; ++i) a.set(i, value(me, i) + 1000);
    SendOptions so;
    so.tag = 9;
    c.send(a.p(), count, DType::I32, right, so).wait();
    SendRecvOptions sr;
    sr.recv_tag = 9;
    c.send_recv(nullptr, 0, -1, b.p(), count, left, DType::I32, sr).wait();
    for (size_t i = 0; i < count; ++i)
      expect_eq(b.get(i), value(left, i) + 1000, DType::I32, w + " from send", i);
    if (me == 0) {
      SendRecvOptions ss;
      ss.send_tag = 11;
      c.send_recv(a.p(), count, 1, nullptr, 0, -1, DType::I32, ss).wait();
    } else if (me == 1) {
      RecvOptions ro;
      ro.tag = 11;
      c.recv(b.p(), count, DType::I32, 0, ro).wait();
      for (size_t i = 0; i < count; ++i)
        expect_eq(b.get(i), value(0, i) + 1000, DType::I32, w + " to recv", i);
    }
  }
  c.barrier().wait();
}

void check_traffic(Communicator& c, DType t) {
  const int n = c.size(), me = c.rank();
  const double es = static_cast<double>(dtype_size(t)), nn = n;
  const size_t count = 10;
  c.reset_traffic();
  Communicator::Traffic want;  // this rank's bytes, by the convention of communicator.h
  auto check = [&](const char* after) {
    const Communicator::Traffic& got = c.traffic();
    const std::pair<const char*, std::pair<double, double>> fields[] = {
        {"all_reduce", {got.all_reduce, want.all_reduce}},
        {"all_gather", {got.all_gather, want.all_gather}},
        {"reduce_scatter", {got.reduce_scatter, want.reduce_scatter}},
        {"broadcast", {got.broadcast, want.broadcast}},
        {"all_to_all", {got.all_to_all, want.all_to_all}},
        {"point_to_point", {got.point_to_point, want.point_to_point}},
        {"total", {got.total(), want.total()}}};
    for (const auto& [name, v] : fields)
      if (std::abs(v.first - v.second) > 1e-9 * std::max(1.0, v.second)) {
        std::ostringstream os;
        os << "traffic on rank " << me << "/" << n << " (" << dtype_name(t) << ") after " << after
           << ": " << name << " = " << v.first << " bytes, expected " << v.second;
        throw std::runtime_error(os.str());
      }
  };
  const bool reduces = t != DType::U8 && t != DType::U16 && t != DType::F16;
  Buf in(t, count * n), out(t, count * n);
  for (size_t i = 0; i < count * n; ++i) in.set(i, value(me, i));
  if (reduces) {
    c.all_reduce(in.p(), out.p(), count, t).wait();
    want.all_reduce += n == 1 ? 0 : 2 * (nn - 1) / nn * count * es;
    check("all_reduce");
    c.reduce_scatter(in.p(), out.p(), count, t).wait();
    want.reduce_scatter += n == 1 ? 0 : (nn - 1) * count * es;
    check("reduce_scatter");
  }
  c.all_gather(in.p(), out.p(), count, t).wait();
  want.all_gather += n == 1 ? 0 : (nn - 1) / nn * (nn * count * es);
  check("all_gather");
  BroadcastOptions bo;
  bo.root = n - 1;
  c.broadcast(out.p(), count, t, bo).wait();
  want.broadcast += n == 1 ? 0 : (nn - 1) / nn * count * es;  // the root counts the same
  check("broadcast");
  c.all_to_all(in.p(), out.p(), count, t).wait();
  want.all_to_all += n == 1 ? 0 : (nn - 1) * count * es;
  check("all_to_all");
  // Rank i sends i + j + 1 elements to rank j: blocks differ by pair, and both sides agree.
  std::vector<size_t> sc(n), rc(n);
  size_t total = 0, to_others = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = rc[p] = static_cast<size_t>(me + p + 1);
    total += sc[p];
    if (p != me) to_others += sc[p];
  }
  Buf vin(t, total), vout(t, total);
  c.all_to_allv(vin.p(), sc, vout.p(), rc, t).wait();
  want.all_to_all += static_cast<double>(to_others) * es;  // the block to itself is not sent
  check("all_to_allv");
  if (c.exchange_counts(sc) != rc) throw std::runtime_error("exchange_counts: wrong counts");
  want.all_to_all += n == 1 ? 0 : (nn - 1) * 8;  // an all_to_all of one I64 per rank
  check("exchange_counts");
  c.barrier().wait();
  check("barrier");
  {
    auto child = c.split(0, me);
    if (child->traffic().total() != 0) throw std::runtime_error("a split's child starts at 0");
  }
  check("split");
  if (n > 1) {
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    Buf msg(t, count), got(t, count);
    SendOptions so;
    so.tag = 9;
    c.send(msg.p(), count, t, right, so).wait();
    want.point_to_point += count * es;
    check("send");
    RecvOptions ro;
    ro.tag = 9;
    c.recv(got.p(), count, t, left, ro).wait();
    check("recv");  // receiving sends nothing
    // Send 3 to the right, receive 3 from the left: the send half counts.
    c.send_recv(msg.p(), 3, right, got.p(), 3, left, t).wait();
    want.point_to_point += 3 * es;
    check("send_recv");
    // Pipeline edges: rank 0 only sends to rank 1, rank 1 only receives from rank 0.
    if (me == 0) {
      c.send_recv(msg.p(), 4, 1, nullptr, 0, -1, t).wait();
      want.point_to_point += 4 * es;
    } else if (me == 1) {
      c.send_recv(nullptr, 0, -1, got.p(), 4, 0, t).wait();
    }
    check("send_recv with a skipped half");
  }
  // An exchange with itself is a copy: nothing is sent.
  Buf self_in(t, count), self_out(t, count);
  c.send_recv(self_in.p(), count, me, self_out.p(), count, me, t).wait();
  check("send_recv with itself");
  c.barrier().wait();  // every rank is done before the next test's calls
  c.reset_traffic();
  want = Communicator::Traffic{};
  check("reset_traffic");
}

}  // namespace tessera::comm::test
