// Fault injection (comm/fault.h) on the inproc backend: the TESSERA_FAULT format and its errors,
// and each fault kind ending every rank within the deadline with an error that names the call,
// the communicator and the ranks involved. Every test bounds its elapsed time.
#include "tessera/comm/fault.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "helpers.h"

namespace tessera::comm::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

CommOptions with_fault(const std::string& spec, Timeout timeout) {
  CommOptions o;
  o.timeout = timeout;
  o.fault = std::make_shared<const FaultSpec>(parse_fault_spec(spec));
  return o;
}

std::string config_error(const std::string& spec) {
  try {
    parse_fault_spec(spec);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(FaultSpec, ParsesEveryKind) {
  FaultSpec d = parse_fault_spec("rank=1,op=37,kind=delay:5000ms");
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.op, 37u);
  EXPECT_EQ(d.kind, FaultKind::Delay);
  EXPECT_EQ(d.delay, 5000ms);
  EXPECT_EQ(d.text, "rank=1,op=37,kind=delay:5000ms");
  EXPECT_EQ(parse_fault_spec("kind=delay:2s,op=1,rank=0").delay, 2000ms);
  EXPECT_EQ(parse_fault_spec("rank=0,op=1,kind=throw").kind, FaultKind::Throw);
  FaultSpec e = parse_fault_spec("rank=3,op=2,kind=exit");
  EXPECT_EQ(e.kind, FaultKind::Exit);
  EXPECT_EQ(e.exit_status, 1);
  EXPECT_EQ(parse_fault_spec("rank=3,op=2,kind=exit:7").exit_status, 7);
  FaultSpec m = parse_fault_spec("rank=2,op=4,kind=mismatch,call=recv,comm=pp");
  EXPECT_EQ(m.kind, FaultKind::Mismatch);
  EXPECT_EQ(m.call, "recv");
  EXPECT_EQ(m.comm, "pp");
}

TEST(FaultSpec, RejectsMalformedSpecsSayingWhy) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "'' is not key=value"},
      {"rank=1,op=2", "'kind=' is missing"},
      {"op=2,kind=throw", "'rank=' is missing"},
      {"rank=1,kind=throw", "'op=' is missing"},
      {"rank=-1,op=2,kind=throw", "rank must be a world rank (0, 1, ...), got '-1'"},
      {"rank=1,op=0,kind=throw", "op must be a call number counted from 1, got '0'"},
      {"rank=1,op=x,kind=throw", "got 'x'"},
      {"rank=1,op=2,kind=delay", "kind=delay needs a duration"},
      {"rank=1,op=2,kind=delay:5", "got 'delay:5'"},
      {"rank=1,op=2,kind=delay:2h", "got 'delay:2h'"},
      {"rank=1,op=2,kind=delay:3600001ms", "at most an hour"},
      {"rank=1,op=2,kind=throw:3", "kind=throw takes no argument"},
      {"rank=1,op=2,kind=exit:256", "kind=exit:STATUS needs a status in [0, 255]"},
      {"rank=1,op=2,kind=crash", "unknown kind 'crash'"},
      {"rank=1,op=2,kind=throw,call=allreduce", "call must name an operation"},
      {"rank=1,op=2,kind=throw,comm=", "comm needs a communicator name"},
      {"rank=1,op=2,kind=throw,when=now", "unknown key 'when'"},
      {"rank=1,rank=2,op=2,kind=throw", "'rank' is given twice"},
      {"rank=1,op=2,kind=throw,", "'' is not key=value"},
  };
  for (const auto& [spec, why] : cases) {
    const std::string msg = config_error(spec);
    EXPECT_TRUE(has(msg, std::string("TESSERA_FAULT='") + spec + "': ")) << msg;
    EXPECT_TRUE(has(msg, why)) << spec << " -> " << msg;
    EXPECT_TRUE(has(msg, "; the format is rank=R,op=N,kind=")) << msg;
  }
}

TEST(FaultSpec, EnvironmentSetsItAndMismatchTurnsOnTheFingerprintCheck) {
  ::setenv("TESSERA_FAULT", "rank=1,op=3,kind=mismatch", 1);
  CommOptions o = resolve_options({});
  ASSERT_NE(o.fault, nullptr);
  EXPECT_EQ(o.fault->rank, 1);
  EXPECT_TRUE(o.debug);  // so that MPI catches it too
  ::setenv("TESSERA_FAULT", "rank=1,op=3,kind=throw", 1);
  EXPECT_FALSE(resolve_options({}).debug);
  ::setenv("TESSERA_FAULT", "rank=1,op=3", 1);
  EXPECT_THROW(resolve_options({}), ConfigError);
  ::unsetenv("TESSERA_FAULT");
  EXPECT_EQ(resolve_options({}).fault, nullptr);
}

// A supervisor's restarts (--max-restarts) each get their own fault: TESSERA_ATTEMPT picks the
// first of the ';'-separated list that applies; every item is checked even when not chosen.
TEST(FaultSpec, EachRestartAttemptGetsTheFaultMeantForIt) {
  const char* list =
      "attempt=0,rank=1,op=40,kind=throw; attempt=2,rank=0,op=9,kind=exit;"
      "rank=3,op=5,kind=delay:1s";
  EXPECT_EQ(select_fault_spec(list, 0)->rank, 1);
  EXPECT_EQ(select_fault_spec(list, 0)->text, "attempt=0,rank=1,op=40,kind=throw");
  EXPECT_EQ(select_fault_spec(list, 2)->kind, FaultKind::Exit);
  EXPECT_EQ(select_fault_spec(list, 1)->rank, 3);  // the one without attempt= applies to all
  EXPECT_FALSE(select_fault_spec("attempt=1,rank=0,op=1,kind=throw", 0).has_value());
  EXPECT_THROW(select_fault_spec("attempt=0,rank=0,op=1,kind=throw;rank=0,op=0,kind=throw", 0),
               ConfigError);
  EXPECT_TRUE(has(config_error("rank=0,op=1,kind=throw,attempt=x"),
                  "attempt must be a restart attempt (0, 1, ...), got 'x'"));

  ::setenv("TESSERA_FAULT", list, 1);
  ::setenv("TESSERA_ATTEMPT", "2", 1);
  ASSERT_NE(resolve_options({}).fault, nullptr);
  EXPECT_EQ(resolve_options({}).fault->op, 9u);
  ::setenv("TESSERA_FAULT", "attempt=0,rank=1,op=3,kind=throw", 1);
  EXPECT_EQ(resolve_options({}).fault, nullptr);
  ::setenv("TESSERA_ATTEMPT", "two", 1);
  EXPECT_THROW(resolve_options({}), ConfigError);
  ::unsetenv("TESSERA_ATTEMPT");
  ::unsetenv("TESSERA_FAULT");
}
// A delay shorter than the deadline only slows the job down: the results are right.
TEST(InjectedFault, DelayWithinTheDeadlineOnlySlowsTheJob) {
  auto t0 = Clock::now();
  spawn(
      3,
      [](Communicator& c) {
        for (int i = 0; i < 3; ++i) {
          float x = static_cast<float>(c.rank() + 1);
          c.all_reduce(&x, 1, DType::F32).wait();
          EXPECT_EQ(x, 6.0f);
        }
      },
      with_fault("rank=1,op=2,kind=delay:300ms", 5000ms));
  EXPECT_GE(since_ms(t0), 300);
  EXPECT_LT(since_ms(t0), 3000);
}

// A delay past the deadline: the peers time out naming the late rank, and the late rank's wait
// ends when the world fails, not after its 30 s.
TEST(InjectedFault, DelayPastTheDeadlineTimesOutNamingTheLateRank) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      3,
      [](Communicator& c) {
        std::vector<float> x(1000, 1.0f);
        c.all_reduce(x.data(), x.size(), DType::F32).wait();
        c.all_reduce(x.data(), x.size(), DType::F32).wait();
      },
      with_fault("rank=2,op=2,kind=delay:30s", 400ms));
  EXPECT_LT(since_ms(t0), 2000) << "the delayed rank must not sleep on in a failed world";
  int timeouts = 0;
  for (int r : {0, 1}) {
    ASSERT_TRUE(holds<TimeoutError>(errs[r]) || holds<PeerFailedError>(errs[r])) << what(errs[r]);
    timeouts += holds<TimeoutError>(errs[r]);
    EXPECT_TRUE(has(what(errs[r]), "all_reduce #2 (F32 x 1000, sum) on communicator 'world'"))
        << what(errs[r]);
    EXPECT_TRUE(has(what(errs[r]), "timed out after 400 ms waiting for rank 2 to arrive"))
        << what(errs[r]);
  }
  EXPECT_GE(timeouts, 1);
  ASSERT_TRUE(holds<PeerFailedError>(errs[2])) << what(errs[2]);
  EXPECT_TRUE(
      has(what(errs[2]), "all_reduce #2 (F32 x 1000, sum) on communicator 'world' rank 2/3"))
      << what(errs[2]);
}

// A rank that throws: its call fails with InjectedFaultError naming the call, and the peers fail
// at once (not after the 20 s deadline) quoting it.
TEST(InjectedFault, ThrowFailsTheCallAndThePeersFast) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      4,
      [](Communicator& c) {
        std::vector<float> x(5000, 1.0f);
        for (int i = 0; i < 4; ++i) c.all_reduce(x.data(), x.size(), DType::F32).wait();
      },
      with_fault("rank=2,op=3,kind=throw", 20000ms));
  EXPECT_LT(since_ms(t0), 2000);
  ASSERT_TRUE(holds<InjectedFaultError>(errs[2])) << what(errs[2]);
  EXPECT_TRUE(has(what(errs[2]),
                  "all_reduce #3 (F32 x 5000, sum) on communicator 'world' rank "
                  "2/4: injected fault (TESSERA_FAULT=rank=2,op=3,kind=throw) on "
                  "world rank 2"))
      << what(errs[2]);
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(holds<PeerFailedError>(errs[r])) << what(errs[r]);
    EXPECT_TRUE(has(what(errs[r]), "all_reduce #3 (F32 x 5000, sum) on communicator 'world' rank "))
        << what(errs[r]);
    EXPECT_TRUE(has(what(errs[r]), "rank 2 of communicator 'world' (world rank 2) failed"))
        << what(errs[r]);
  }
}

// A rank that exits: its thread unwinds with InjectedExit; the peers waiting for it fail at once
// naming it, and the world is not reported as failed by the exiting rank itself.
TEST(InjectedFault, ExitEndsTheRankAndThePeersFailNamingIt) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      3,
      [](Communicator& c) {
        float x = 1;
        for (int i = 0; i < 3; ++i) c.all_reduce(&x, 1, DType::F32).wait();
      },
      with_fault("rank=1,op=2,kind=exit", 20000ms));
  EXPECT_LT(since_ms(t0), 2000);
  ASSERT_TRUE(holds<InjectedExit>(errs[1])) << what(errs[1]);
  EXPECT_TRUE(has(what(errs[1]),
                  "all_reduce #2 (F32 x 1, sum) on communicator 'world' rank 1/3: "
                  "world rank 1 exited here"))
      << what(errs[1]);
  for (int r : {0, 2}) {
    ASSERT_TRUE(holds<PeerFailedError>(errs[r])) << what(errs[r]);
    EXPECT_TRUE(has(what(errs[r]), "all_reduce #2 (F32 x 1, sum) on communicator 'world' rank "))
        << what(errs[r]);
    EXPECT_TRUE(has(what(errs[r]), "rank 1 (world rank 1) returned from its function"))
        << what(errs[r]);
  }
}

// A rank that issues another collective: the fingerprint check fails every rank, naming who
// called what, before any data moves.
TEST(InjectedFault, MismatchIsCaughtByTheFingerprintCheckOnEveryRank) {
  auto t0 = Clock::now();
  auto errs = spawn_collect(
      3,
      [](Communicator& c) {
        std::vector<float> x(100, 1.0f);
        c.all_reduce(x.data(), x.size(), DType::F32).wait();
        c.all_reduce(x.data(), x.size(), DType::F32).wait();
        c.barrier().wait();
      },
      with_fault("rank=0,op=2,kind=mismatch", 20000ms));
  EXPECT_LT(since_ms(t0), 2000);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(holds<MismatchError>(errs[r])) << what(errs[r]);
    EXPECT_TRUE(has(what(errs[r]), "collective mismatch on communicator 'world' rank "))
        << what(errs[r]);
    EXPECT_TRUE(has(what(errs[r]),
                    "rank 0 called barrier #2; ranks 1,2 called all_reduce #2 (F32 "
                    "x 100, sum)"))
        << what(errs[r]);
  }
  // A barrier becomes a 0-element broadcast.
  errs = spawn_collect(
      2, [](Communicator& c) { c.barrier().wait(); },
      with_fault("rank=1,op=1,kind=mismatch", 20000ms));
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(has(what(errs[r]),
                    "rank 0 called barrier #1; rank 1 called broadcast #1 (F32 x 0, "
                    "root 0)"))
        << what(errs[r]);
}

// Pipelines: a rank blocked in recv whose peer exits fails at once naming the peer; one whose
// peer is late past the deadline times out naming it; a message one element short is a mismatch
// on the receiver. call= counts only that operation.
TEST(InjectedFault, PointToPointFaultsEndTheReceiver) {
  auto pipeline = [](Communicator& c) {
    std::vector<float> act(64, 1.0f);
    for (int m = 0; m < 3; ++m) {
      if (c.rank() == 0) c.send(act.data(), act.size(), DType::F32, 1).wait();
      if (c.rank() == 1) c.recv(act.data(), act.size(), DType::F32, 0).wait();
    }
  };
  auto t0 = Clock::now();
  auto errs = spawn_collect(2, pipeline, with_fault("rank=0,op=2,kind=exit,call=send", 20000ms));
  EXPECT_LT(since_ms(t0), 2000);
  ASSERT_TRUE(holds<InjectedExit>(errs[0])) << what(errs[0]);
  EXPECT_TRUE(has(what(errs[0]),
                  "send (F32 x 64, tag 0, to rank 1) on communicator 'world' rank "
                  "0/2: world rank 0 exited here"))
      << what(errs[0]);
  ASSERT_TRUE(holds<PeerFailedError>(errs[1])) << what(errs[1]);
  EXPECT_TRUE(has(what(errs[1]),
                  "recv (F32 x 64, tag 0, from rank 0) on communicator 'world' rank "
                  "1/2: rank 0 returned from its function without sending"))
      << what(errs[1]);

  t0 = Clock::now();
  errs = spawn_collect(2, pipeline, with_fault("rank=0,op=3,kind=delay:30s", 300ms));
  EXPECT_LT(since_ms(t0), 2000);
  ASSERT_TRUE(holds<TimeoutError>(errs[1])) << what(errs[1]);
  EXPECT_TRUE(has(what(errs[1]),
                  "recv (F32 x 64, tag 0, from rank 0) on communicator 'world' rank "
                  "1/2: timed out after 300 ms waiting for rank 0 to send"))
      << what(errs[1]);

  errs = spawn_collect(2, pipeline, with_fault("rank=0,op=1,kind=mismatch,call=send", 20000ms));
  ASSERT_TRUE(holds<MismatchError>(errs[1])) << what(errs[1]);
  EXPECT_TRUE(has(what(errs[1]), "rank 0 sent F32 x 63 with tag 0, this rank expects F32 x 64"))
      << what(errs[1]);
}

// The count is per rank across all its communicators (split passes it on); comm= restricts it to
// the communicators of that name.
TEST(InjectedFault, CountsEveryCommunicatorOfTheRankOrOnlyTheNamedOnes) {
  auto job = [](Communicator& c) {
    auto half = c.split(c.rank() / 2, c.rank(), c.rank() < 2 ? "half[0,1]" : "half[2,3]");
    float x = 1;
    c.all_reduce(&x, 1, DType::F32).wait();      // rank 1's call 1
    half->all_reduce(&x, 1, DType::F32).wait();  // call 2, the first on 'half[0,1]'
    c.all_reduce(&x, 1, DType::F32).wait();      // call 3
    half->all_reduce(&x, 1, DType::F32).wait();  // call 4, the second on 'half[0,1]'
  };
  // The world's collectives are #2 and #3: the split was #1.
  auto errs = spawn_collect(4, job, with_fault("rank=1,op=3,kind=throw", 20000ms));
  EXPECT_TRUE(has(what(errs[1]),
                  "all_reduce #3 (F32 x 1, sum) on communicator 'world' rank 1/4: "
                  "injected fault"))
      << what(errs[1]);
  for (int r : {0, 2, 3}) EXPECT_TRUE(holds<PeerFailedError>(errs[r])) << what(errs[r]);
  errs = spawn_collect(4, job, with_fault("rank=1,op=2,kind=throw,comm=half", 20000ms));
  EXPECT_TRUE(has(what(errs[1]),
                  "all_reduce #2 (F32 x 1, sum) on communicator 'half[0,1]' rank "
                  "1/2: injected fault"))
      << what(errs[1]);
  EXPECT_TRUE(holds<PeerFailedError>(errs[0])) << what(errs[0]);
}

}  // namespace
}  // namespace tessera::comm::test
