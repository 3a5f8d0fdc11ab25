// Failure behaviour of the inproc backend: mismatches, peers that throw or return, timeouts.
// Nothing here may hang: every test bounds its elapsed time.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "helpers.h"
#include "tessera/comm/inproc/world.h"

namespace tessera::comm::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

CommOptions with_timeout(Timeout t) {
  CommOptions o;
  o.timeout = t;
  return o;
}

TEST(InprocFailure, MismatchedOpsFailOnEveryRank) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      3,
      [](Communicator& c) {
        float x[6] = {};
        if (c.rank() == 1)
          c.all_gather(x, x + 3, 1, DType::F32).wait();
        else
          c.all_reduce(x, 2, DType::F32).wait();
      },
      with_timeout(2000ms));
  EXPECT_LT(since_ms(t0), 1500);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(holds<MismatchError>(errs[r])) << "rank " << r << ": " << what(errs[r]);
    EXPECT_NE(what(errs[r]).find("ranks 0,2 called all_reduce #1"), std::string::npos)
        << what(errs[r]);
    EXPECT_NE(what(errs[r]).find("rank 1 called all_gather #1"), std::string::npos)
        << what(errs[r]);
  }
}

TEST(InprocFailure, MismatchedCountsFailOnEveryRank) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      4,
      [](Communicator& c) {
        std::vector<float> x(100);
        c.all_reduce(x.data(), c.rank() == 3 ? 99 : 100, DType::F32).wait();
      },
      with_timeout(2000ms));
  EXPECT_LT(since_ms(t0), 1500);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(holds<MismatchError>(errs[r])) << what(errs[r]);
    EXPECT_NE(what(errs[r]).find("rank 3 called all_reduce #1 (F32 x 99, sum)"), std::string::npos)
        << what(errs[r]);
  }
}

TEST(InprocFailure, MismatchedRootsAndDtypes) {
  auto errs = spawn_collect(2, [](Communicator& c) {
    int x[2] = {};
    BroadcastOptions o;
    o.root = c.rank();
    c.broadcast(x, 2, DType::I32, o).wait();
  });
  for (auto& e : errs) EXPECT_TRUE(holds<MismatchError>(e)) << what(e);
  errs = spawn_collect(2, [](Communicator& c) {
    int64_t x[2] = {};
    c.all_reduce(x, 2, c.rank() ? DType::I64 : DType::I32).wait();
  });
  for (auto& e : errs) EXPECT_TRUE(holds<MismatchError>(e)) << what(e);
}

TEST(InprocFailure, AllToAllvCountMismatchFailsEverywhere) {
  auto errs = spawn_collect(3, [](Communicator& c) {
    std::vector<size_t> sc(3, 2), rc(3, 2);
    if (c.rank() == 2) rc[0] = 3;
    std::vector<float> in(6), out(7);
    c.all_to_allv(in.data(), sc, out.data(), rc, DType::F32).wait();
  });
  for (auto& e : errs) {
    ASSERT_TRUE(holds<MismatchError>(e)) << what(e);
    EXPECT_NE(what(e).find("rank 0 sends 2 elements to rank 2, which expects 3"),
              std::string::npos);
  }
}

TEST(InprocFailure, AllToAllvTimeoutNamesOpAndPeer) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(3, [](Communicator& c) {
    std::vector<size_t> counts(3, 1);
    std::vector<float> in(3), out(3);
    if (c.rank() == 2) std::this_thread::sleep_for(700ms);  // late, but alive
    AllToAllOptions o;
    o.timeout = 300ms;
    c.all_to_allv(in.data(), counts, out.data(), counts, DType::F32, o).wait();
  });
  EXPECT_LT(since_ms(t0), 1500);
  ASSERT_TRUE(holds<TimeoutError>(errs[0]) || holds<PeerFailedError>(errs[0])) << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("all_to_allv #1"), std::string::npos) << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("timed out"), std::string::npos) << what(errs[0]);
  EXPECT_TRUE(holds<PeerFailedError>(errs[2])) << what(errs[2]);
}

TEST(InprocFailure, RankThatThrowsMakesOthersFailFast) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      4,
      [](Communicator& c) {
        std::vector<float> x(1 << 16, 1.0f);
        c.all_reduce(x.data(), x.size(), DType::F32).wait();  // one good collective
        if (c.rank() == 2) {
          std::this_thread::sleep_for(50ms);  // the others are already waiting
          throw std::runtime_error("boom in the forward pass");
        }
        c.all_reduce(x.data(), x.size(), DType::F32).wait();
      },
      with_timeout(20000ms));
  EXPECT_LT(since_ms(t0), 2000) << "peers must not wait for the 20 s timeout";
  EXPECT_EQ(what(errs[2]), "boom in the forward pass");
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(holds<PeerFailedError>(errs[r])) << what(errs[r]);
    EXPECT_NE(what(errs[r]).find("boom in the forward pass"), std::string::npos) << what(errs[r]);
    EXPECT_NE(what(errs[r]).find("all_reduce #2"), std::string::npos) << what(errs[r]);
  }
}

TEST(InprocFailure, RankThatReturnsEarlyMakesOthersFail) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      3,
      [](Communicator& c) {
        if (c.rank() == 1) return;  // forgets the collective
        float x = 1;
        c.all_reduce(&x, 1, DType::F32).wait();
      },
      with_timeout(20000ms));
  EXPECT_LT(since_ms(t0), 2000);
  EXPECT_EQ(errs[1], nullptr);
  for (int r : {0, 2}) {
    ASSERT_TRUE(holds<PeerFailedError>(errs[r])) << what(errs[r]);
    EXPECT_NE(what(errs[r]).find("rank 1 (world rank 1) returned from its function"),
              std::string::npos)
        << what(errs[r]);
  }
}

TEST(InprocFailure, TimeoutNamesOpAndPeer) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(3, [](Communicator& c) {
    std::vector<float> x(1000, 1.0f);
    if (c.rank() == 2) std::this_thread::sleep_for(700ms);  // late, but alive
    AllReduceOptions o;
    o.timeout = 300ms;
    if (c.rank() == 1) o.timeout = 10000ms;
    c.all_reduce(x.data(), x.size(), DType::F32, o).wait();
  });
  EXPECT_LT(since_ms(t0), 1500);
  ASSERT_TRUE(holds<TimeoutError>(errs[0])) << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("all_reduce #1 (F32 x 1000, sum) on communicator 'world' rank 0/3: "
                               "timed out after 300 ms waiting for rank 2 to arrive"),
            std::string::npos)
      << what(errs[0]);
  // Rank 1 (long timeout) learns of rank 0's timeout at once; rank 2 finds the world poisoned.
  EXPECT_TRUE(holds<PeerFailedError>(errs[1])) << what(errs[1]);
  EXPECT_NE(what(errs[1]).find("timed out"), std::string::npos) << what(errs[1]);
  EXPECT_TRUE(holds<PeerFailedError>(errs[2])) << what(errs[2]);
}

TEST(InprocFailure, RecvTimeoutNamesPeerAndTag) {
  auto errs = spawn_collect(2, [](Communicator& c) {
    if (c.rank() == 1) {
      std::this_thread::sleep_for(400ms);
      return;
    }
    float x;
    RecvOptions o;
    o.tag = 7;
    o.timeout = 100ms;
    c.recv(&x, 1, DType::F32, 1, o).wait();
  });
  ASSERT_TRUE(holds<TimeoutError>(errs[0])) << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("recv (F32 x 1, tag 7, from rank 1)"), std::string::npos)
      << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("waiting for rank 1 to send"), std::string::npos) << what(errs[0]);
}

TEST(InprocFailure, RecvFromExitedPeerFailsFast) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      2,
      [](Communicator& c) {
        if (c.rank() == 1) return;
        float x;
        c.recv(&x, 1, DType::F32, 1).wait();
      },
      with_timeout(20000ms));
  EXPECT_LT(since_ms(t0), 2000);
  EXPECT_TRUE(holds<PeerFailedError>(errs[0])) << what(errs[0]);
}

TEST(InprocFailure, SendRecvCountMismatch) {
  auto errs = spawn_collect(2, [](Communicator& c) {
    float x[4] = {};
    if (c.rank() == 0)
      c.send(x, 4, DType::F32, 1).wait();
    else
      c.recv(x, 3, DType::F32, 0).wait();
  });
  EXPECT_TRUE(holds<MismatchError>(errs[1])) << what(errs[1]);
}

// A peer that never posts: the exchange times out naming the op, the communicator and the peer
// for both halves.
TEST(InprocFailure, SendRecvTimeoutNamesPeer) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(2, [](Communicator& c) {
    if (c.rank() == 1) {
      std::this_thread::sleep_for(500ms);
      return;
    }
    float s[4] = {1, 2, 3, 4}, r[4];
    SendRecvOptions o;
    o.timeout = 200ms;
    o.send_tag = 3;
    c.send_recv(s, 4, 1, r, 4, 1, DType::F32, o).wait();
  });
  EXPECT_LT(since_ms(t0), 1500);
  ASSERT_TRUE(holds<TimeoutError>(errs[0])) << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("send_recv (F32 x 4 to rank 1 tag 3, F32 x 4 from rank 1 tag 0) on "
                               "communicator 'world' rank 0/2: timed out after 200 ms waiting for "
                               "rank 1 to send and for rank 1 to receive this rank's message"),
            std::string::npos)
      << what(errs[0]);
}

// The receive completes but the peer never takes this rank's message: the timeout names that
// half alone. The failed call takes its message back out of the peer's mailbox (the peer, which
// finds the world poisoned, fails cleanly; sanitizer builds would catch a read of the freed
// buffer).
TEST(InprocFailure, SendRecvUnreceivedMessageTimesOut) {
  auto errs = spawn_collect(3, [](Communicator& c) {
    std::vector<float> s(1000, 1.0f), r(1000);
    if (c.rank() == 1) {
      c.send(s.data(), s.size(), DType::F32, 0).wait();  // eager: rank 0's receive completes
      std::this_thread::sleep_for(500ms);                // rank 0 times out meanwhile
      // Fails on the poisoned world.
      c.recv(r.data(), r.size(), DType::F32, 0).wait();
      return;
    }
    if (c.rank() == 2) return;
    SendRecvOptions o;
    o.timeout = 200ms;
    c.send_recv(s.data(), s.size(), 1, r.data(), r.size(), 1, DType::F32, o).wait();
  });
  ASSERT_TRUE(holds<TimeoutError>(errs[0])) << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("rank 0/3: timed out after 200 ms waiting for rank 1 to receive "
                               "this rank's message"),
            std::string::npos)
      << what(errs[0]);
  ASSERT_TRUE(holds<PeerFailedError>(errs[1])) << what(errs[1]);
  EXPECT_NE(what(errs[1]).find("recv (F32 x 1000, tag 0, from rank 0)"), std::string::npos)
      << what(errs[1]);
}

TEST(InprocFailure, SendRecvWithExitedPeerFailsFast) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      3,
      [](Communicator& c) {
        if (c.rank() == 2) return;  // rank 1 receives from it
        float s = 1, r = 0;
        if (c.rank() == 0) {
          c.send_recv(&s, 1, 1, nullptr, 0, -1, DType::F32).wait();
        } else {
          c.send_recv(nullptr, 0, -1, &r, 1, 2, DType::F32).wait();
        }
      },
      with_timeout(20000ms));
  EXPECT_LT(since_ms(t0), 2000) << "peers must not wait for the 20 s timeout";
  ASSERT_TRUE(holds<PeerFailedError>(errs[1])) << what(errs[1]);
  EXPECT_NE(what(errs[1]).find("rank 2 returned from its function without sending"),
            std::string::npos)
      << what(errs[1]);
  // Rank 0 waits for rank 1 to take its message; rank 1's failure poisons the world.
  ASSERT_TRUE(holds<PeerFailedError>(errs[0])) << what(errs[0]);
  errs = spawn_collect(
      2,
      [](Communicator& c) {
        if (c.rank() == 1) return;
        float s = 1;
        c.send_recv(&s, 1, 1, nullptr, 0, -1, DType::F32).wait();
      },
      with_timeout(20000ms));
  ASSERT_TRUE(holds<PeerFailedError>(errs[0])) << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("rank 1 returned from its function without receiving"),
            std::string::npos)
      << what(errs[0]);
}

TEST(InprocFailure, ExchangeCountMismatch) {
  auto errs = spawn_collect(2, [](Communicator& c) {
    float s[4] = {}, r[4] = {};
    c.send_recv(s, 4, 1 - c.rank(), r, c.rank() == 1 ? 3 : 4, 1 - c.rank(), DType::F32).wait();
  });
  ASSERT_TRUE(holds<MismatchError>(errs[1])) << what(errs[1]);
  EXPECT_NE(what(errs[1]).find("rank 0 sent F32 x 4 with tag 0, this rank expects F32 x 3"),
            std::string::npos)
      << what(errs[1]);
  ASSERT_TRUE(holds<PeerFailedError>(errs[0])) << what(errs[0]);
  EXPECT_NE(what(errs[0]).find("this rank expects F32 x 3"), std::string::npos) << what(errs[0]);
}

TEST(InprocFailure, CommunicatorIsPoisonedAfterFailure) {
  auto errs = spawn_collect(2, [](Communicator& c) {
    float x[2] = {};
    Work w = c.all_reduce(x, c.rank() + 1, DType::F32);
    EXPECT_TRUE(w.is_completed());
    EXPECT_THROW(w.wait(), MismatchError);
    auto t0 = Clock::now();
    EXPECT_THROW(c.barrier().wait(), PeerFailedError);  // at once, no waiting
    EXPECT_LT(since_ms(t0), 100);
    EXPECT_THROW(c.split(0, 0), PeerFailedError);
  });
  for (auto& e : errs) EXPECT_EQ(e, nullptr) << what(e);
}

TEST(InprocFailure, FailurePoisonsSubCommunicatorsToo) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      4,
      [](Communicator& c) {
        auto half = c.split(c.rank() / 2, 0);
        if (c.rank() == 0) throw std::runtime_error("rank 0 gives up");
        float x = 1;
        half->all_reduce(&x, 1, DType::F32).wait();  // rank 1 waits for rank 0 in its half
        c.barrier().wait();
      },
      with_timeout(20000ms));
  EXPECT_LT(since_ms(t0), 2000);
  EXPECT_TRUE(holds<PeerFailedError>(errs[1])) << what(errs[1]);
  EXPECT_NE(what(errs[1]).find("rank 0 gives up"), std::string::npos);
  for (int r : {2, 3}) EXPECT_TRUE(holds<PeerFailedError>(errs[r])) << what(errs[r]);
}

TEST(InprocFailure, WaitWithTimeoutNamesTheOp) {
  spawn(2, [](Communicator& c) {
    float x = 1;
    if (c.rank() == 1) std::this_thread::sleep_for(300ms);
    AllReduceOptions o;
    o.async = true;
    Work w = c.all_reduce(&x, 1, DType::F32, o);
    if (c.rank() == 0) {
      try {
        w.wait(20ms);
        ADD_FAILURE() << "expected a timeout";
      } catch (const TimeoutError& e) {
        EXPECT_NE(std::string(e.what()).find("wait for all_reduce #1"), std::string::npos)
            << e.what();
      }
    }
    w.wait();  // the operation itself still completes
    EXPECT_EQ(x, 2.0f);
  });
}

TEST(InprocFailure, RunInprocRethrowsTheFirstError) {
  try {
    spawn(3, [](Communicator& c) {
      if (c.rank() == 1) throw ConfigError("bad flag on rank 1");
      c.barrier().wait();
    });
    FAIL() << "expected an exception";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "bad flag on rank 1");
  }
}

TEST(CommOptions, EnvironmentOverrides) {
  ::setenv("TESSERA_COMM_TIMEOUT_S", "1.5", 1);
  ::setenv("TESSERA_COMM_DEBUG", "1", 1);
  CommOptions o = resolve_options({});
  EXPECT_EQ(o.timeout, Timeout(1500));
  EXPECT_TRUE(o.debug);
  CommOptions explicit_timeout;
  explicit_timeout.timeout = Timeout(5);
  EXPECT_EQ(resolve_options(explicit_timeout).timeout, Timeout(5));
  ::setenv("TESSERA_COMM_TIMEOUT_S", "soon", 1);
  EXPECT_THROW(resolve_options({}), ConfigError);
  ::unsetenv("TESSERA_COMM_TIMEOUT_S");
  ::unsetenv("TESSERA_COMM_DEBUG");
  EXPECT_EQ(resolve_options({}).timeout, std::chrono::seconds(300));
  EXPECT_EQ(resolve_options({}).stream_min_bytes, kDefaultStreamMinBytes);
  ::setenv("TESSERA_COMM_STREAM_MIN_BYTES", "1048576", 1);
  EXPECT_EQ(resolve_options({}).stream_min_bytes, size_t{1} << 20);
  CommOptions explicit_stream;
  explicit_stream.stream_min_bytes = 7;
  EXPECT_EQ(resolve_options(explicit_stream).stream_min_bytes, 7u);
  ::setenv("TESSERA_COMM_STREAM_MIN_BYTES", "-1", 1);
  EXPECT_THROW(resolve_options({}), ConfigError);
  ::setenv("TESSERA_COMM_STREAM_MIN_BYTES", "4MiB", 1);
  EXPECT_THROW(resolve_options({}), ConfigError);
  ::unsetenv("TESSERA_COMM_STREAM_MIN_BYTES");
}

}  // namespace
}  // namespace tessera::comm::test
