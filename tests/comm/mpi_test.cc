// The MPI backend, run by CTest under `mpiexec -n 2` and `-n 3`. Every rank runs the same tests in
// the same order. Skips (saying why) when built without MPI or not launched by mpiexec.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "helpers.h"
#include "tessera/comm/fault.h"
#include "tessera/comm/mpi/runtime.h"

namespace tessera::comm::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

#if defined(TESSERA_COMM_SANITIZED)
constexpr size_t kLarge = (size_t{1} << 16) + 3;
#else
constexpr size_t kLarge = (size_t{1} << 20) + 3;
#endif

Communicator& world() {
  static std::unique_ptr<Communicator> w = [] {
    CommOptions o;
    o.timeout = 60s;
    return mpi_world(o);
  }();
  return *w;
}

class Mpi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi_available()) GTEST_SKIP() << "SKIPPED: tessera was built without MPI";
    if (!launched_by_mpi()) GTEST_SKIP() << "SKIPPED: not launched by mpiexec/mpirun";
    world().barrier().wait();
  }
  void TearDown() override {
    if (mpi_available() && launched_by_mpi()) world().barrier().wait();
  }
};

TEST_F(Mpi, WorldIsMpi) {
  EXPECT_EQ(world().backend(), "mpi");
  EXPECT_GE(world().size(), 2);
}

// Every process of these tests runs on this machine (under mpiexec, or in the test cluster's
// network namespaces of one kernel: tests/apps/cluster_script_test.sh), so the world counts them
// all, and waits yield their core at once when they outnumber its hardware threads.
TEST_F(Mpi, CountsEveryProcessOnThisMachine) {
  EXPECT_EQ(mpi::runtime_access::machine_processes(), world().size());
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(mpi::runtime_access::oversubscribed(1), world().size() > hw);
  EXPECT_TRUE(mpi::runtime_access::oversubscribed(hw));  // hw threads in each process
}

TEST_F(Mpi, AllOpsSmallCounts) {
  Communicator& c = world();
  for (size_t count : {size_t{0}, size_t{1}, size_t{13}, 100 * static_cast<size_t>(c.size()) + 1}) {
    check_all_reduce(c, count, true);
    check_all_gather(c, count, true);
    check_reduce_scatter(c, count, true);
    check_broadcast(c, count, true);
    check_all_to_all(c, count, true);
    check_all_to_allv(c, count);
    check_all_to_allv_patterns(c, count);
    check_send_recv(c, count);
    check_send_recv_exchange(c, count);
  }
}

TEST_F(Mpi, AllOpsLarge) {
  Communicator& c = world();
  const size_t block = kLarge / c.size() + 1;
  check_all_reduce(c, kLarge, false);
  check_all_gather(c, block, false);
  check_reduce_scatter(c, block, false);
  check_broadcast(c, kLarge, false);
  check_all_to_all(c, block, false);
  check_send_recv(c, kLarge);
  check_send_recv_exchange(c, kLarge);
}

// The MPI ring all-reduce (64 KiB to 64 MiB) cuts its chunks into CommOptions::ring_segment_bytes:
// the segment size changes how the chunks travel, never the order in which an element's values
// are combined, so every size gives the same bits (values whose sums round differently in another
// order, fp32 and bf16, sum and mean). Sizes: the default, smaller than a chunk and not dividing
// it (1000 and 65536 bytes), not a whole number of elements (1002), and larger than a chunk.
TEST_F(Mpi, RingSegmentSizeDoesNotChangeTheBits) {
  const int n = world().size(), me = world().rank();
  const size_t count = 100003;  // chunks of 33334-50002 elements: 200 KB in fp32 at n = 2
  std::vector<std::vector<unsigned char>> first;
  for (size_t seg :
       {size_t{256} << 10, size_t{1000}, size_t{1002}, size_t{65536}, size_t{8} << 20}) {
    CommOptions o;
    o.timeout = 60s;
    o.ring_segment_bytes = seg;
    auto c = mpi_world(o);
    std::vector<std::vector<unsigned char>> results;
    for (DType t : {DType::F32, DType::BF16})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
        std::vector<float> x(count);
        for (size_t i = 0; i < count; ++i)  // magnitudes 2^-10 .. 2^10: rounding depends on order
          x[i] = std::ldexp(1.0f + static_cast<float>((i * 7919 + me * 104729) % 1000) / 997.0f,
                            static_cast<int>((i * 31 + me * 17) % 21) - 10) *
                 ((i + me) % 3 ? 1.0f : -1.0f);
        std::vector<unsigned char> buf(count * dtype_size(t));
        for (size_t i = 0; i < count; ++i) {
          if (t == DType::F32)
            std::memcpy(buf.data() + 4 * i, &x[i], 4);
          else
            reinterpret_cast<bf16*>(buf.data())[i] = to_bf16(x[i]);
        }
        AllReduceOptions ao;
        ao.op = op;
        c->all_reduce(buf.data(), count, t, ao).wait();
        // Close to the sum in double (bf16: within its rounding).
        for (size_t i = 0; i < count; i += 997) {
          double want = 0;
          for (int r = 0; r < n; ++r) {
            float v = std::ldexp(1.0f + static_cast<float>((i * 7919 + r * 104729) % 1000) / 997.0f,
                                 static_cast<int>((i * 31 + r * 17) % 21) - 10) *
                      ((i + r) % 3 ? 1.0f : -1.0f);
            want += t == DType::BF16 ? from_bf16(to_bf16(v)) : v;
          }
          if (op == ReduceOp::Mean) want /= n;
          float got;
          if (t == DType::F32)
            std::memcpy(&got, buf.data() + 4 * i, 4);
          else
            got = from_bf16(reinterpret_cast<bf16*>(buf.data())[i]);
          ASSERT_NEAR(got, want, (t == DType::BF16 ? 2e-2 : 1e-5) * (std::abs(want) + 1e-2))
              << "segment " << seg << " bytes, element " << i;
        }
        results.push_back(std::move(buf));
      }
    if (first.empty()) {
      first = std::move(results);
      continue;
    }
    for (size_t k = 0; k < results.size(); ++k)
      EXPECT_TRUE(results[k] == first[k])
          << "segment " << seg << " bytes: result " << k << " differs from the default's bits";
  }
}

// The frontend counts the bytes of every op the same way on MPI (Communicator::traffic()).
TEST_F(Mpi, TrafficCountsEveryOpKind) {
  check_traffic(world(), DType::F32);
  check_traffic(world(), DType::BF16);
  auto one = world().split(world().rank(), 0);  // size 1: nothing is sent
  check_traffic(*one, DType::F32);
}

TEST_F(Mpi, SplitAndConcurrentCollectives) {
  Communicator& w = world();
  auto half = w.split(w.rank() % 2, w.rank());
  ASSERT_NE(half, nullptr);
  const int expect_size = (w.size() + 1 - w.rank() % 2) / 2;
  EXPECT_EQ(half->size(), expect_size);
  check_all_reduce(*half, 13, true);
  for (int i = 0; i < 10; ++i) {
    std::vector<float> a(50000, 1.0f), b(50000, 1.0f);
    AllReduceOptions o;
    o.async = true;
    Work wa = half->all_reduce(a.data(), a.size(), DType::F32, o);  // sub-communicator's thread
    w.all_reduce(b.data(), b.size(), DType::F32).wait();            // world, this thread
    wa.wait();
    EXPECT_EQ(a[49999], static_cast<float>(expect_size));
    EXPECT_EQ(b[0], static_cast<float>(w.size()));
  }
  auto none = w.split(w.rank() == 0 ? -1 : 0, 0);
  EXPECT_EQ(none == nullptr, w.rank() == 0);
}

TEST_F(Mpi, DebugModeMismatchFailsOnEveryRank) {
  CommOptions o;
  o.debug = true;
  o.timeout = 5s;
  auto c = mpi_world(o);
  float x[8] = {};
  Work wk =
      c->rank() == 1 ? c->all_gather(x, x + 4, 1, DType::F32) : c->all_reduce(x, 2, DType::F32);
  try {
    wk.wait();
    ADD_FAILURE() << "expected a MismatchError";
  } catch (const MismatchError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 1 called all_gather #1"), std::string::npos) << m;
    EXPECT_NE(m.find("all_reduce #1 (F32 x 2, sum)"), std::string::npos) << m;
  }
}

TEST_F(Mpi, DebugModeTimeoutNamesMissingRank) {
  CommOptions o;
  o.debug = true;
  o.timeout = 300ms;
  auto c = mpi_world(o);
  float x = 1;
  if (c->rank() == 1) {
    std::this_thread::sleep_for(600ms);  // never joins
    return;
  }
  auto t0 = Clock::now();
  try {
    c->all_reduce(&x, 1, DType::F32).wait();
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("all_reduce #1 (F32 x 1, sum)"), std::string::npos) << m;
    EXPECT_NE(m.find("waiting for rank(s) 1"), std::string::npos) << m;
  }
  EXPECT_LT(since_ms(t0), 2000);
  EXPECT_THROW(c->barrier().wait(), PeerFailedError);  // poisoned
}

TEST_F(Mpi, PeerThatThrowsMakesOthersTimeOut) {
  auto c = world().split(0, world().rank());
  // MPI cannot cancel a collective: the abandoned request may still write into x after the
  // timeout, so x must outlive it (the library documents this).
  static std::vector<float> x(1000, 1.0f);
  if (c->rank() == 1) {
    // "Throws" before the collective: the others must fail within their timeout.
    std::this_thread::sleep_for(700ms);
    // Complete the abandoned collective so that no request is left in flight at exit.
    AllReduceOptions late;
    late.timeout = 30s;
    c->all_reduce(x.data(), x.size(), DType::F32, late).wait();
    return;
  }
  AllReduceOptions o;
  o.timeout = 300ms;
  auto t0 = Clock::now();
  try {
    c->all_reduce(x.data(), x.size(), DType::F32, o).wait();
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce #1 (F32 x 1000, sum)"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(since_ms(t0), 2000);
}

// Fault injection (comm/fault.h) on MPI. Processes cannot be told of a peer's failure: they
// time out, and the fingerprint exchange names the rank that never came.
std::unique_ptr<Communicator> faulty_world(const std::string& spec, Timeout timeout, bool debug) {
  CommOptions o;
  o.timeout = timeout;
  o.debug = debug;
  o.fault = std::make_shared<const FaultSpec>(parse_fault_spec(spec));
  return mpi_world(o);
}

TEST_F(Mpi, InjectedThrowFailsTheCallAndThePeersTimeOutNamingTheRank) {
  auto c = faulty_world("rank=1,op=2,kind=throw", 400ms, true);
  float x = 1;
  c->all_reduce(&x, 1, DType::F32).wait();
  const std::string at = "all_reduce #2 (F32 x 1, sum) on communicator 'world' rank " +
                         std::to_string(c->rank()) + "/" + std::to_string(c->size()) + ": ";
  auto t0 = Clock::now();
  try {
    c->all_reduce(&x, 1, DType::F32).wait();
    ADD_FAILURE() << "expected the injected fault or a timeout";
  } catch (const InjectedFaultError& e) {
    EXPECT_EQ(c->rank(), 1);
    EXPECT_NE(
        std::string(e.what()).find(at + "injected fault (TESSERA_FAULT=rank=1,op=2,kind=throw)"),
        std::string::npos)
        << e.what();
  } catch (const TimeoutError& e) {
    EXPECT_NE(c->rank(), 1);
    EXPECT_NE(std::string(e.what()).find(
                  at + "timed out after 400 ms waiting for rank(s) 1 to reach this collective"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(since_ms(t0), 2000);
}

TEST_F(Mpi, InjectedMismatchTurnsOnTheFingerprintCheckAndFailsEveryRank) {
  auto c = faulty_world("rank=0,op=1,kind=mismatch", 5s, false);
  EXPECT_TRUE(c->options().debug);
  std::vector<float> x(100, 1.0f);
  try {
    c->all_reduce(x.data(), x.size(), DType::F32).wait();
    ADD_FAILURE() << "expected a MismatchError";
  } catch (const MismatchError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("collective mismatch on communicator 'world' rank "), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 called barrier #1; "), std::string::npos) << m;
    EXPECT_NE(m.find(" called all_reduce #1 (F32 x 100, sum)"), std::string::npos) << m;
  }
}

TEST_F(Mpi, InjectedDelayPastTheDeadlineTimesOutEveryRank) {
  auto c = faulty_world("rank=1,op=1,kind=delay:1200ms", 300ms, true);
  float x = 1;
  auto t0 = Clock::now();
  try {
    c->all_reduce(&x, 1, DType::F32).wait();
    ADD_FAILURE() << "expected a timeout";
  } catch (const TimeoutError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("all_reduce #1 (F32 x 1, sum) on communicator 'world' rank "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("timed out after 300 ms waiting for"), std::string::npos) << m;
    if (c->rank() != 1) {
      EXPECT_NE(m.find("waiting for rank(s) 1 to reach this collective"), std::string::npos) << m;
    }
  }
  EXPECT_LT(since_ms(t0), c->rank() == 1 ? 3000 : 1000);
}

TEST_F(Mpi, RecvTimeoutNamesPeer) {
  auto c = world().split(0, world().rank());
  if (c->rank() != 0) return;
  float x;
  RecvOptions o;
  o.timeout = 200ms;
  o.tag = 3;
  try {
    c->recv(&x, 1, DType::F32, 1, o).wait();
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for rank 1 to send"), std::string::npos)
        << e.what();
  }
}

// A peer that never posts its half of an exchange: the exchange times out naming the peer.
TEST_F(Mpi, SendRecvTimeoutNamesPeer) {
  auto c = world().split(0, world().rank());
  float s[2] = {1, 2}, r[2] = {};
  if (c->rank() == 1) {
    // Late: takes rank 0's (eagerly delivered) message only after rank 0 has timed out.
    std::this_thread::sleep_for(600ms);
    RecvOptions late;
    late.tag = 4;
    late.timeout = 30s;
    c->recv(r, 2, DType::F32, 0, late).wait();
    EXPECT_EQ(r[1], 2.0f);
    return;
  }
  if (c->rank() != 0) return;
  SendRecvOptions o;
  o.timeout = 200ms;
  o.send_tag = 4;
  auto t0 = Clock::now();
  try {
    c->send_recv(s, 2, 1, r, 2, 1, DType::F32, o).wait();
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("send_recv (F32 x 2 to rank 1 tag 4, F32 x 2 from rank 1 "
                                         "tag 0) on communicator 'world.0' rank 0/"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("timed out after 200 ms waiting for rank 1 to send"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(since_ms(t0), 2000);
  EXPECT_THROW(c->barrier().wait(), PeerFailedError);  // poisoned
}

// A receive count that disagrees with what the peer sends fails on every rank with the same
// MismatchError, whether the receiver expects more (a short message) or fewer elements (MPI
// truncates the block; the receive buffer is never overrun), and a rank that never calls makes the
// others time out naming the op and the rank.
TEST_F(Mpi, AllToAllvCountMismatchFailsEverywhereAndTimeoutNamesTheOp) {
  CommOptions o;
  o.timeout = 2s;
  for (size_t expect : {size_t{3}, size_t{1}}) {
    auto c = mpi_world(o);
    const int n = c->size();
    std::vector<size_t> sc(n, 2), rc(n, 2);
    if (c->rank() == n - 1) rc[0] = expect;  // rank 0 sends it 2
    std::vector<float> in(2 * n, 1.0f), out(2 * n + 2, -1.0f);
    try {
      c->all_to_allv(in.data(), sc, out.data(), rc, DType::F32).wait();
      ADD_FAILURE() << "expected a MismatchError";
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("all_to_allv #1 (F32) on communicator 'world' rank " +
                                           std::to_string(c->rank()) + "/" + std::to_string(n) +
                                           ": send and receive counts disagree (rank " +
                                           std::to_string(n - 1) +
                                           " expects different counts than its peers send it)"),
                std::string::npos)
          << e.what();
    }
    const size_t received = 2 * n - 2 + rc[0];
    for (size_t i = received; i < out.size(); ++i)  // nothing written past the receive counts
      EXPECT_EQ(out[i], -1.0f) << i;
    EXPECT_THROW(c->barrier().wait(), PeerFailedError);  // poisoned
  }
  CommOptions t;
  t.timeout = 300ms;
  auto d = mpi_world(t);
  const int n = d->size();
  std::vector<float> in(2 * n), out(2 * n + 1);
  if (d->rank() == 1) {
    // Never joins, but keeps `d` until the others have given up: the messages they sent it must
    // arrive while it exists (Open MPI would hand messages for a freed communicator to the next
    // one that gets its context id).
    std::this_thread::sleep_for(600ms);
    world().barrier().wait();
    return;
  }
  std::vector<size_t> ones(n, 1);
  auto t0 = Clock::now();
  try {
    d->all_to_allv(in.data(), ones, out.data(), ones, DType::F32).wait();
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("all_to_allv #1 (F32) on communicator 'world' rank "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("timed out after 300 ms waiting for rank(s) 1 to send"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(since_ms(t0), 2000);
  world().barrier().wait();
}

TEST_F(Mpi, SendRecvCountMismatch) {
  for (size_t expect : {size_t{3}, size_t{5}}) {
    auto c = world().split(world().rank() < 2 ? 0 : -1, world().rank());
    if (!c) continue;
    float s[4] = {1, 2, 3, 4}, r[5] = {};
    const int other = 1 - c->rank();
    // Rank 0 sends 4 and expects 4; rank 1 sends 4 and expects `expect`.
    const size_t want = c->rank() == 1 ? expect : 4;
    Work w = c->send_recv(s, 4, other, r, want, other, DType::F32);
    if (c->rank() == 1) {
      try {
        w.wait();
        ADD_FAILURE() << "expected a MismatchError";
      } catch (const MismatchError& e) {
        EXPECT_NE(std::string(e.what()).find("rank 0 sent"), std::string::npos) << e.what();
      }
    } else {
      w.wait();
    }
  }
}

}  // namespace
}  // namespace tessera::comm::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!tessera::comm::mpi_available())
    std::printf("SKIPPED: tessera was built without MPI; test_comm_mpi has nothing to test\n");
  else if (!tessera::comm::launched_by_mpi())
    std::printf("SKIPPED: test_comm_mpi must be started by mpiexec (CTest does this)\n");
  return RUN_ALL_TESTS();
}
