// Correctness of every op on the inproc backend, parameterised over world sizes and counts.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <tuple>

#include "helpers.h"
#include "tessera/comm/inproc/world.h"

namespace tessera::comm::test {
namespace {

#if defined(TESSERA_COMM_SANITIZED)
constexpr size_t kLarge = (size_t{1} << 16) + 3;  // sanitizers are 5-20x slower
#else
constexpr size_t kLarge = (size_t{1} << 20) + 3;  // 4 MiB of F32 per rank
#endif

enum class Size { Zero, One, Thirteen, Indivisible, Large };
const char* size_name(Size s) {
  switch (s) {
    case Size::Zero:
      return "0";
    case Size::One:
      return "1";
    case Size::Thirteen:
      return "13";
    case Size::Indivisible:
      return "Indivisible";
    case Size::Large:
      return "Large";
  }
  return "?";
}
size_t count_of(Size s, int n) {
  switch (s) {
    case Size::Zero:
      return 0;
    case Size::One:
      return 1;
    case Size::Thirteen:
      return 13;
    case Size::Indivisible:
      return 1000 * static_cast<size_t>(n) + 1;
    case Size::Large:
      return kLarge;
  }
  return 0;
}

using Param = std::tuple<int, Size>;

class Collectives : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    // Several-MiB cases on up to 4 ranks: 7 ranks on 2 cores would dominate the suite's time.
    if (std::get<1>(GetParam()) == Size::Large && n() > 4)
      GTEST_SKIP() << "large counts run for world sizes 1-4";
  }
  int n() const { return std::get<0>(GetParam()); }
  size_t count() const { return count_of(std::get<1>(GetParam()), n()); }
  bool full() const { return std::get<1>(GetParam()) != Size::Large; }
  // Large per-rank blocks for the ops whose buffers are n x count: keep memory modest.
  size_t block() const { return full() ? count() : count() / static_cast<size_t>(n()) + 1; }
};

TEST_P(Collectives, AllReduce) {
  spawn(n(), [&](Communicator& c) { check_all_reduce(c, count(), full()); });
}
TEST_P(Collectives, AllGather) {
  spawn(n(), [&](Communicator& c) { check_all_gather(c, block(), full()); });
}
TEST_P(Collectives, ReduceScatter) {
  spawn(n(), [&](Communicator& c) { check_reduce_scatter(c, block(), full()); });
}
TEST_P(Collectives, Broadcast) {
  spawn(n(), [&](Communicator& c) { check_broadcast(c, count(), full()); });
}
TEST_P(Collectives, AllToAll) {
  spawn(n(), [&](Communicator& c) { check_all_to_all(c, block(), full()); });
}
TEST_P(Collectives, AllToAllV) {
  spawn(n(), [&](Communicator& c) { check_all_to_allv(c, block()); });
}
TEST_P(Collectives, AllToAllVZeroOneRankAndRandomCounts) {
  spawn(n(), [&](Communicator& c) { check_all_to_allv_patterns(c, block()); });
}
TEST_P(Collectives, SendRecv) {
  spawn(n(), [&](Communicator& c) { check_send_recv(c, count()); });
}
TEST_P(Collectives, SendRecvExchange) {
  spawn(n(), [&](Communicator& c) { check_send_recv_exchange(c, count()); });
}
TEST_P(Collectives, TensorOverloads) {
  if (!full()) GTEST_SKIP() << "covered by the raw-buffer tests";
  spawn(n(), [&](Communicator& c) {
    const int64_t k = static_cast<int64_t>(count());
    Tensor t = Tensor::zeros({k});
    t.fill_(static_cast<float>(c.rank() + 1));
    c.all_reduce(t).wait();
    for (float v : t.to_vector()) ASSERT_EQ(v, n() * (n() + 1) / 2.0f);
    Tensor g = Tensor::zeros({k * c.size()});
    Tensor s = Tensor::zeros({k});
    s.fill_(static_cast<float>(c.rank()));
    c.all_gather(s, g).wait();
    auto gv = g.to_vector();
    for (int64_t i = 0; i < k * c.size(); ++i) ASSERT_EQ(gv[i], static_cast<float>(i / k));
    Tensor rs = Tensor::zeros({k});
    c.reduce_scatter(g, rs).wait();
    for (float v : rs.to_vector()) ASSERT_EQ(v, static_cast<float>(c.rank() * c.size()));
    // send_recv around the ring; an undefined tensor stands for a skipped half.
    Tensor from = Tensor::zeros({k});
    c.send_recv(s, (c.rank() + 1) % c.size(), from, (c.rank() + c.size() - 1) % c.size()).wait();
    for (float v : from.to_vector())
      ASSERT_EQ(v, static_cast<float>((c.rank() + c.size() - 1) % c.size()));
    Tensor none;
    c.send_recv(none, -1, none, -1).wait();
    c.barrier().wait();
  });
}

INSTANTIATE_TEST_SUITE_P(Inproc, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 7),
                                            ::testing::Values(Size::Zero, Size::One, Size::Thirteen,
                                                              Size::Indivisible, Size::Large)),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return "n" + std::to_string(std::get<0>(i.param)) + "_count" +
                                  size_name(std::get<1>(i.param));
                         });

// The seed's example.
TEST(Inproc, SeedExampleAllReduceSum) {
  const float data[4][2] = {{0.1f, 0.2f}, {0.3f, 0.4f}, {0.1f, 0.1f}, {0.2f, 0.1f}};
  for (Algorithm a : {Algorithm::Small, Algorithm::Direct, Algorithm::Ring}) {
    spawn(4, [&](Communicator& c) {
      Tensor t = Tensor::from({data[c.rank()][0], data[c.rank()][1]}, {2});
      AllReduceOptions o;
      o.algorithm = a;
      c.all_reduce(t, o).wait();
      auto v = t.to_vector();
      EXPECT_NEAR(v[0], 0.7f, 1e-6f);
      EXPECT_NEAR(v[1], 0.8f, 1e-6f);
    });
  }
}

// All ranks get bit-identical results, whatever the algorithm.
TEST(Inproc, AllRanksAgreeBitwise) {
  const size_t count = 100003;
  for (Algorithm a : {Algorithm::Direct, Algorithm::Ring}) {
    std::vector<std::vector<float>> results(3);
    spawn(3, [&](Communicator& c) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i)
        v[i] = 0.1f * static_cast<float>(i % 17) + 0.37f * c.rank();
      AllReduceOptions o;
      o.algorithm = a;
      o.op = ReduceOp::Mean;
      c.all_reduce(v.data(), count, DType::F32, o).wait();
      results[c.rank()] = v;
    });
    EXPECT_EQ(results[0], results[1]);
    EXPECT_EQ(results[0], results[2]);
  }
}

// F64 reductions keep double precision: values 1 + k * 2^-45 need 46 significant bits (a float has
// 24), and every algorithm gives the sum, mean, max and min computed in double, bit for bit.
TEST(Inproc, F64ReductionsAreExactDoubles) {
  const size_t count = 70001;
  auto v = [](int r, size_t i) {
    return 1.0 + std::ldexp(static_cast<double>((r + 1) * static_cast<int>(i % 7 + 1)), -45);
  };
  for (Algorithm a : {Algorithm::Small, Algorithm::Direct, Algorithm::Ring}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
      spawn(3, [&](Communicator& c) {
        const size_t k = a == Algorithm::Small ? 100 : count;
        std::vector<double> x(k);
        for (size_t i = 0; i < k; ++i) x[i] = v(c.rank(), i);
        AllReduceOptions o;
        o.algorithm = a;
        o.op = op;
        c.all_reduce(x.data(), k, DType::F64, o).wait();
        for (size_t i = 0; i < k; ++i) {
          double want = v(0, i);
          for (int r = 1; r < 3; ++r)
            want = op == ReduceOp::Max   ? std::max(want, v(r, i))
                   : op == ReduceOp::Min ? std::min(want, v(r, i))
                                         : want + v(r, i);
          if (op == ReduceOp::Mean) want /= 3;
          ASSERT_EQ(x[i], want) << algorithm_name(a) << " " << reduce_op_name(op) << " at " << i;
        }
        // reduce_scatter too.
        std::vector<double> in(3 * 5), out(5);
        for (size_t i = 0; i < in.size(); ++i) in[i] = v(c.rank(), i);
        ReduceScatterOptions rs;
        rs.op = op;
        c.reduce_scatter(in.data(), out.data(), 5, DType::F64, rs).wait();
        for (size_t i = 0; i < 5; ++i) {
          const size_t g = static_cast<size_t>(c.rank()) * 5 + i;
          double want = v(0, g);
          for (int r = 1; r < 3; ++r)
            want = op == ReduceOp::Max   ? std::max(want, v(r, g))
                   : op == ReduceOp::Min ? std::min(want, v(r, g))
                                         : want + v(r, g);
          if (op == ReduceOp::Mean) want /= 3;
          ASSERT_EQ(out[i], want) << "reduce_scatter " << reduce_op_name(op) << " at " << i;
        }
      });
    }
  }
}

// Ring with tiny segments: many pipeline units per chunk.
TEST(Inproc, RingPipelinesManySegments) {
  CommOptions opts;
  opts.ring_segment_bytes = 64;
  opts.timeout = std::chrono::seconds(20);
  run_inproc(
      4,
      [](Communicator& c) {
        for (size_t count : {size_t{5}, size_t{1001}, size_t{40000}}) {
          std::vector<int64_t> v(count);
          for (size_t i = 0; i < count; ++i) v[i] = static_cast<int64_t>(i) * (c.rank() + 1);
          AllReduceOptions o;
          o.algorithm = Algorithm::Ring;
          c.all_reduce(v.data(), count, DType::I64, o).wait();
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(v[i], static_cast<int64_t>(i) * 10);
        }
      },
      opts);
}

TEST(Inproc, AsyncWorkOverlapsAndCompletesInOrder) {
  spawn(3, [](Communicator& c) {
    std::vector<std::vector<float>> bufs(8, std::vector<float>(5000, 1.0f));
    std::vector<Work> works;
    AllReduceOptions o;
    o.async = true;
    for (auto& b : bufs) works.push_back(c.all_reduce(b.data(), b.size(), DType::F32, o));
    // A synchronous call after queued ones runs after them.
    float x = 1;
    c.all_reduce(&x, 1, DType::F32).wait();
    EXPECT_EQ(x, 3.0f);
    for (auto& w : works) {
      EXPECT_TRUE(w.is_completed());
      w.wait();
    }
    for (auto& b : bufs) EXPECT_EQ(b[4999], 3.0f);
  });
}

TEST(Inproc, SizeOneShortCircuits) {
  auto world = InprocWorld::create(1);
  auto c = world->communicator(0);
  float a[3] = {1, 2, 3}, b[3] = {};
  c->all_reduce(a, b, 3, DType::F32).wait();
  EXPECT_EQ(b[2], 3.0f);
  AllReduceOptions mean;
  mean.op = ReduceOp::Mean;
  c->all_reduce(a, 3, DType::F32, mean).wait();
  EXPECT_EQ(a[1], 2.0f);
  EXPECT_THROW(c->send(a, 3, DType::F32, 0), CommUsageError);
  auto sub = c->split(0, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(c->split(-1, 0), nullptr);
}

TEST(Inproc, UsageErrors) {
  spawn(2, [](Communicator& c) {
    uint8_t u[4] = {};
    EXPECT_THROW(c.all_reduce(u, 4, DType::U8), CommUsageError);
    BroadcastOptions bad;
    bad.root = 2;
    float f = 0;
    EXPECT_THROW(c.broadcast(&f, 1, DType::F32, bad), CommUsageError);
    EXPECT_THROW(c.send(&f, 1, DType::F32, c.rank()), CommUsageError);
    // send_recv: peers out of range, itself on one side only, negative tags, overlapping buffers.
    float s[4] = {}, r[4] = {};
    const int other = 1 - c.rank();
    EXPECT_THROW(c.send_recv(s, 1, 2, r, 1, other, DType::F32), CommUsageError);
    EXPECT_THROW(c.send_recv(s, 1, other, r, 1, -2, DType::F32), CommUsageError);
    EXPECT_THROW(c.send_recv(s, 1, c.rank(), r, 1, other, DType::F32), CommUsageError);
    EXPECT_THROW(c.send_recv(s, 1, -1, r, 1, c.rank(), DType::F32), CommUsageError);
    SendRecvOptions neg;
    neg.recv_tag = -1;
    EXPECT_THROW(c.send_recv(s, 1, other, r, 1, other, DType::F32, neg), CommUsageError);
    EXPECT_THROW(c.send_recv(s, 4, other, s + 2, 2, other, DType::F32), CommUsageError);
    EXPECT_THROW(c.send_recv(nullptr, 1, other, r, 1, other, DType::F32), CommUsageError);
    // With itself: a copy; the two halves must agree.
    s[0] = 3.5f;
    c.send_recv(s, 1, c.rank(), r, 1, c.rank(), DType::F32).wait();
    EXPECT_EQ(r[0], 3.5f);
    EXPECT_THROW(c.send_recv(s, 2, c.rank(), r, 1, c.rank(), DType::F32), CommUsageError);
    // Data movement works for every dtype.
    uint8_t g[2] = {};
    c.all_gather(&u[0], g, 1, DType::U8).wait();
  });
}

// ---- sub-communicators -------------------------------------------------------------------------

// 6 ranks as a 2x3 grid: rows (3 ranks) and columns (2 ranks), collectives on both at once.
TEST(InprocSplit, GridRowsAndColumnsConcurrently) {
  spawn(6, [](Communicator& world) {
    const int r = world.rank(), row = r / 3, col = r % 3;
    auto rows = world.split(row, col);
    auto cols = world.split(col, row);
    ASSERT_EQ(rows->size(), 3);
    ASSERT_EQ(cols->size(), 2);
    EXPECT_EQ(rows->rank(), col);
    EXPECT_EQ(cols->rank(), row);
    EXPECT_EQ(rows->name(), "world." + std::to_string(row));
    for (int iter = 0; iter < 20; ++iter) {
      const size_t count = iter % 2 ? 100000 : 7;
      std::vector<float> a(count, static_cast<float>(r)), b(count, static_cast<float>(r));
      AllReduceOptions o;
      o.async = true;
      Work wa = rows->all_reduce(a.data(), count, DType::F32, o);  // progress thread of rows
      // Meanwhile, on this thread, the columns.
      AllReduceOptions mx;
      mx.op = ReduceOp::Max;
      cols->all_reduce(b.data(), count, DType::F32, mx).wait();
      wa.wait();
      EXPECT_EQ(a[count - 1], static_cast<float>(3 * row * 3 + 0 + 1 + 2));
      EXPECT_EQ(b[0], static_cast<float>(3 + col));
    }
    // Row and column collectives issued from two threads of the same rank.
    std::thread t([&] {
      for (int i = 0; i < 50; ++i) {
        int v = 1;
        rows->all_reduce(&v, 1, DType::I32).wait();
        EXPECT_EQ(v, 3);
      }
    });
    for (int i = 0; i < 50; ++i) {
      int v = 1;
      cols->all_reduce(&v, 1, DType::I32).wait();
      EXPECT_EQ(v, 2);
    }
    t.join();
    // Split of a split, and a rank that joins no group.
    auto pair = rows->split(col == 2 ? -1 : 0, -col);
    if (col == 2) {
      EXPECT_EQ(pair, nullptr);
    } else {
      ASSERT_NE(pair, nullptr);
      EXPECT_EQ(pair->size(), 2);
      EXPECT_EQ(pair->rank(), 1 - col);  // key -col reverses the order
      int v = pair->rank();
      BroadcastOptions bo;
      bo.root = 1;
      pair->broadcast(&v, 1, DType::I32, bo).wait();
      EXPECT_EQ(v, 1);
    }
    world.barrier().wait();
  });
}

}  // namespace
}  // namespace tessera::comm::test
