// Communicator::traffic(): the bytes a rank sends, counted once in the frontend per kind of op
// (communicator.h gives the convention), on the inproc backend.
#include <gtest/gtest.h>

#include <thread>

#include "helpers.h"
#include "tessera/comm/fault.h"

namespace tessera::comm::test {
namespace {

using namespace std::chrono_literals;

TEST(Traffic, EveryOpKindOnOneTwoAndThreeRanksInFp32AndBf16) {
  for (int n : {1, 2, 3})
    for (DType t : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + std::string(dtype_name(t)));
      spawn(n, [t](Communicator& c) { check_traffic(c, t); });
    }
}

TEST(Traffic, SizeOneCountsNothing) {
  spawn(1, [](Communicator& c) {
    float x[4] = {1, 2, 3, 4};
    c.all_reduce(x, 4, DType::F32).wait();
    c.broadcast(x, 4, DType::F32).wait();
    c.send_recv(x, 2, 0, x + 2, 2, 0, DType::F32).wait();
    EXPECT_EQ(c.traffic().total(), 0.0);
  });
}

// An asynchronous call is counted when it is issued, before it has run.
TEST(Traffic, AsyncCallsCountAtSubmission) {
  spawn(2, [](Communicator& c) {
    std::vector<float> x(1000, 1.0f);
    if (c.rank() == 1) std::this_thread::sleep_for(200ms);  // rank 0's call cannot finish yet
    AllReduceOptions o;
    o.async = true;
    Work w = c.all_reduce(x.data(), x.size(), DType::F32, o);
    EXPECT_EQ(c.traffic().all_reduce, 4000.0);  // 2 (n-1)/n x 1000 x 4 bytes, n = 2
    if (c.rank() == 0) {
      EXPECT_FALSE(w.is_completed());
    }
    w.wait();
    EXPECT_EQ(x[0], 2.0f);
    EXPECT_EQ(c.traffic().total(), 4000.0);
  });
}

// Calls rejected by validation send nothing and count nothing.
TEST(Traffic, CallsThatFailValidationCountNothing) {
  spawn(2, [](Communicator& c) {
    unsigned char b[8] = {};
    EXPECT_THROW(c.all_reduce(b, 8, DType::U8).wait(), CommUsageError);  // no u8 reductions
    BroadcastOptions bo;
    bo.root = 2;
    EXPECT_THROW(c.broadcast(b, 8, DType::U8, bo).wait(), CommUsageError);
    EXPECT_THROW(c.send(b, 8, DType::U8, c.rank()).wait(), CommUsageError);  // to itself
    const size_t three[3] = {1, 1, 1};
    EXPECT_THROW(c.all_to_allv(b, three, b + 4, three, DType::U8).wait(), CommUsageError);
    EXPECT_EQ(c.traffic().total(), 0.0);
    c.all_gather(b, b + 4, 2, DType::U8).wait();  // the communicator still works and counts
    EXPECT_EQ(c.traffic().all_gather, 2.0);
    EXPECT_EQ(c.traffic().total(), 2.0);
  });
}

// An injected throw is rejected at submission (nothing counted); the peers' calls were accepted
// (counted) and fail afterwards; a later call on the unusable communicator counts nothing.
TEST(Traffic, FailedCallsCountOnlyWhenTheyWereAccepted) {
  CommOptions o;
  o.timeout = 2s;
  o.fault = std::make_shared<const FaultSpec>(parse_fault_spec("rank=0,op=1,kind=throw"));
  auto errs = spawn_collect(
      3,
      [](Communicator& c) {
        float x[4] = {};
        Work w = c.all_reduce(x, 4, DType::F32);
        EXPECT_EQ(c.traffic().all_reduce, c.rank() == 0 ? 0.0 : 2 * 2.0 / 3 * 16);
        const double before = c.traffic().total();
        EXPECT_THROW(c.all_reduce(x, 4, DType::F32).wait(), CommError);
        EXPECT_EQ(c.traffic().total(), before);
        w.wait();
      },
      o);
  EXPECT_TRUE(holds<InjectedFaultError>(errs[0])) << what(errs[0]);
  for (int r = 1; r < 3; ++r) EXPECT_TRUE(holds<PeerFailedError>(errs[r])) << what(errs[r]);
}

}  // namespace
}  // namespace tessera::comm::test
