// The hierarchical backend (several thread ranks per MPI process), run by CTest under mpiexec with
// TESSERA_TEST_RANKS_PER_PROCESS ranks in each process (default 2). Every process runs the same
// tests in the same order. Skips (saying why) when built without MPI or not launched by mpiexec.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>

#include "helpers.h"
#include "tessera/comm/fault.h"
#include "tessera/comm/reduce.h"

namespace tessera::comm::test {
namespace {

using namespace std::chrono_literals;

int ranks_per_process() {
  const char* v = std::getenv("TESSERA_TEST_RANKS_PER_PROCESS");
  return v && std::atoi(v) > 0 ? std::atoi(v) : 2;
}

// Runs fn on every rank of a fresh hierarchical world; fails the test with the first error.
void on_world(const std::function<void(Communicator&)>& fn, Timeout timeout = 60s,
              bool debug = false) {
  CommOptions o;
  o.timeout = timeout;
  o.debug = debug;
  try {
    run_hierarchical(ranks_per_process(), fn, o);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

class Hier : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi_available()) GTEST_SKIP() << "SKIPPED: tessera was built without MPI";
    if (!launched_by_mpi()) GTEST_SKIP() << "SKIPPED: not launched by mpiexec/mpirun";
  }
};

// The groups each test runs on: the world; ranks of one process together (rank / R); every
// other rank (members in different processes); and the world in a scrambled order (even ranks
// first, then odd ones, descending), whose runs visit processes more than once.
std::vector<std::unique_ptr<Communicator>> groups(Communicator& world) {
  const int r = world.rank(), R = ranks_per_process();
  std::vector<std::unique_ptr<Communicator>> g;
  g.push_back(world.split(0, r, "copy"));
  g.push_back(world.split(r / R, r, "process"));
  g.push_back(world.split(r % 2, r, "alternate"));
  g.push_back(world.split(0, r % 2 ? 2 * world.size() - r : r, "scrambled"));
  return g;
}

TEST_F(Hier, WorldShape) {
  std::mutex mu;
  std::vector<int> seen;
  on_world([&](Communicator& c) {
    EXPECT_EQ(c.backend(), "hier");
    EXPECT_EQ(c.size() % ranks_per_process(), 0);
    std::lock_guard lk(mu);
    seen.push_back(c.rank());
  });
  ASSERT_EQ(static_cast<int>(seen.size()), ranks_per_process());
  std::sort(seen.begin(), seen.end());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_EQ(seen[i], seen[0] + static_cast<int>(i));
}

TEST_F(Hier, AllOpsOnEveryGroup) {
  on_world([](Communicator& w) {
    for (auto& c : groups(w))
      for (size_t count :
           {size_t{0}, size_t{1}, size_t{13}, 100 * static_cast<size_t>(c->size()) + 1}) {
        check_all_reduce(*c, count, true);
        check_all_gather(*c, count, true);
        check_reduce_scatter(*c, count, true);
        check_broadcast(*c, count, true);
        check_all_to_all(*c, count, true);
        check_all_to_allv(*c, count);
        check_all_to_allv_patterns(*c, count);
        check_send_recv(*c, count);
        check_send_recv_exchange(*c, count);
      }
  });
}

TEST_F(Hier, AllOpsLarge) {
  on_world([](Communicator& w) {
    auto g = groups(w);
    for (Communicator* c : {g[0].get(), g[3].get()}) {  // the world, and scrambled
      const size_t large = (size_t{1} << 18) + 3, block = large / c->size() + 1;
      check_all_reduce(*c, large, false);
      check_all_gather(*c, block, false);
      check_reduce_scatter(*c, block, false);
      check_broadcast(*c, large, false);
      check_all_to_all(*c, block, false);
      check_send_recv(*c, large);
    }
  });
}

TEST_F(Hier, Traffic) {
  on_world([](Communicator& w) {
    for (DType t : {DType::F32, DType::BF16}) check_traffic(w, t);
  });
}

// Values whose sums round differently in another order: magnitudes 2^-10 .. 2^10, both signs.
float order_sensitive(int rank, size_t i) {
  return std::ldexp(1.0f + static_cast<float>((i * 7919 + rank * 104729) % 1000) / 997.0f,
                    static_cast<int>((i * 31 + rank * 17) % 21) - 10) *
         ((i + rank) % 3 ? 1.0f : -1.0f);
}

std::vector<unsigned char> encode(const std::vector<float>& x, DType t) {
  std::vector<unsigned char> b(x.size() * dtype_size(t));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::F32)
      std::memcpy(b.data() + 4 * i, &x[i], 4);
    else
      reinterpret_cast<bf16*>(b.data())[i] = to_bf16(x[i]);
  }
  return b;
}

// all_reduce and reduce_scatter combine the ranks' values left to right in rank order, whatever
// the mapping of ranks to processes: the bits equal reduce_n over every rank's input in rank
// order (what the inproc backend's direct all-reduce computes), on every group shape, for sizes
// below and above one chain segment, fp32 and bf16, sum and mean.
TEST_F(Hier, ReductionsCombineInRankOrder) {
  on_world([](Communicator& w) {
    for (auto& c : groups(w)) {
      const int n = c->size(), me = c->rank();
      for (size_t count : {size_t{1000}, size_t{700001}})
        for (DType t : {DType::F32, DType::BF16})
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
            std::vector<std::vector<unsigned char>> inputs;
            for (int r = 0; r < n; ++r) {
              std::vector<float> x(count);
              for (size_t i = 0; i < count; ++i) x[i] = order_sensitive(r, i);
              inputs.push_back(encode(x, t));
            }
            std::vector<const void*> srcs;
            for (auto& in : inputs) srcs.push_back(in.data());
            std::vector<unsigned char> want(count * dtype_size(t));
            detail::reduce_n(want.data(), srcs.data(), n, count, t, op, n);

            std::vector<unsigned char> buf = inputs[me];
            AllReduceOptions ao;
            ao.op = op;
            c->all_reduce(buf.data(), count, t, ao).wait();
            if (buf != want)
              throw std::runtime_error(detail::concat("all_reduce on '", c->name(), "' (", count,
                                                      " ", dtype_name(t),
                                                      ") differs from the rank-order sum"));
            const size_t block = count / n;
            std::vector<unsigned char> part(block * dtype_size(t));
            ReduceScatterOptions ro;
            ro.op = op;
            c->reduce_scatter(inputs[me].data(), part.data(), block, t, ro).wait();
            if (std::memcmp(part.data(), want.data() + me * part.size(), part.size()) != 0)
              throw std::runtime_error(detail::concat("reduce_scatter on '", c->name(), "' (",
                                                      count, " ", dtype_name(t),
                                                      ") differs from the rank-order sum"));
          }
    }
  });
}

// Debug mode compares the fingerprints of every rank of a communicator, across processes too:
// calls that match give the same results as without it, and a mismatch between processes fails
// on every rank of every process with the same MismatchError (only "rank r/n" differs), where
// without it the ranks would wait for each other until the deadline or mix up data.
TEST_F(Hier, DebugModeMatchingCallsOnEveryGroup) {
  on_world(
      [](Communicator& w) {
        for (auto& c : groups(w))
          for (size_t count : {size_t{0}, size_t{13}, 100 * static_cast<size_t>(c->size()) + 1}) {
            check_all_reduce(*c, count, count < 100);
            check_all_gather(*c, count, false);
            check_reduce_scatter(*c, count, false);
            check_broadcast(*c, count, false);
            check_all_to_all(*c, count, false);
            check_all_to_allv(*c, count);
            check_send_recv(*c, count);
            c->barrier().wait();
          }
      },
      60s, true);
}

// "ranks 0,2 called " or "rank 3 called ", as check_fingerprints names them.
std::string called(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += detail::concat(i ? "," : "", ranks[i]);
  return s + " called ";
}

// What every rank of `c` is to read: "collective mismatch on communicator 'x' rank r/n: <calls>".
std::string mismatch(const Communicator& c, const std::string& calls) {
  return detail::concat("collective mismatch on communicator '", c.name(), "' rank ", c.rank(), "/",
                        c.size(), ": ", calls);
}

// Runs fn on every rank of a fresh debug-mode world whose deadline is 30 s: fn sets `want` and
// issues a call that must fail with a MismatchError saying exactly that, on every rank of this
// process (each process checks its own), in well under the deadline.
void expect_mismatch_everywhere(const std::function<void(Communicator&, std::string& want)>& fn,
                                CommOptions o = {}) {
  o.debug = true;
  o.timeout = 30s;
  std::atomic<int> caught{0};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_hierarchical(
        ranks_per_process(),
        [&](Communicator& w) {
          std::string want;
          try {
            fn(w, want);
            ADD_FAILURE() << "world rank " << w.rank() << ": no MismatchError";
          } catch (const MismatchError& e) {
            EXPECT_EQ(std::string(e.what()), want);
            ++caught;
          }
        },
        o);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  EXPECT_EQ(caught.load(), ranks_per_process());
  EXPECT_LT(since_ms(t0), 10000);
}

// Whether world rank `world_rank` runs in the world's last process.
bool in_last_process(int world_rank, int world_size) {
  return world_rank / ranks_per_process() == world_size / ranks_per_process() - 1;
}

// The last process's ranks all-reduce 12 elements, the others 10: every rank of every process
// catches it (the ranks of one process agree, so only the exchange across processes can).
TEST_F(Hier, DebugModeCountMismatchAcrossProcessesFailsEveryRank) {
  expect_mismatch_everywhere([](Communicator& w, std::string& want) {
    const int n = w.size();
    std::vector<float> x(12, static_cast<float>(w.rank()));
    w.all_reduce(x.data(), 10, DType::F32).wait();  // #1 matches
    EXPECT_EQ(x[0], static_cast<float>(n * (n - 1) / 2));
    std::vector<int> first, last;
    for (int r = 0; r < n; ++r) (in_last_process(r, n) ? last : first).push_back(r);
    want = mismatch(w, called(first) + "all_reduce #2 (F32 x 10, sum); " + called(last) +
                           "all_reduce #2 (F32 x 12, sum)");
    w.all_reduce(x.data(), in_last_process(w.rank(), n) ? 12 : 10, DType::F32).wait();
  });
}

// On a group whose ranks in one process are not consecutive (the scrambled order of groups()),
// the last process's ranks all-gather where the others all-reduce.
TEST_F(Hier, DebugModeOpMismatchAcrossProcessesFailsEveryRank) {
  expect_mismatch_everywhere([](Communicator& w, std::string& want) {
    const int n = w.size();
    auto c = w.split(0, w.rank() % 2 ? 2 * n - w.rank() : w.rank(), "scrambled");
    auto rank_in_c = [&](int r) { return r % 2 == 0 ? r / 2 : n / 2 + (n - 1 - r) / 2; };
    ASSERT_EQ(c->rank(), rank_in_c(w.rank()));
    std::vector<int> first, last;
    for (int g = 0; g < n; ++g)
      for (int r = 0; r < n; ++r)
        if (rank_in_c(r) == g) (in_last_process(r, n) ? last : first).push_back(g);
    want = mismatch(*c, called(first) + "all_reduce #1 (F32 x 2, sum); " + called(last) +
                            "all_gather #1 (F32 x 1)");
    std::vector<float> x(static_cast<size_t>(n), 1.0f), y(static_cast<size_t>(n));
    if (in_last_process(w.rank(), n))
      c->all_gather(x.data(), y.data(), 1, DType::F32).wait();
    else
      c->all_reduce(x.data(), 2, DType::F32).wait();
  });
}

// An injected mismatch (TESSERA_FAULT kind=mismatch turns on debug mode): world rank 0 issues a
// barrier where the others all-reduce; the ranks of the other processes learn it too.
TEST_F(Hier, InjectedMismatchFailsEveryRankOfEveryProcess) {
  CommOptions o;
  o.fault = std::make_shared<const FaultSpec>(parse_fault_spec("rank=0,op=1,kind=mismatch"));
  expect_mismatch_everywhere(
      [](Communicator& w, std::string& want) {
        std::vector<int> others(static_cast<size_t>(w.size() - 1));
        std::iota(others.begin(), others.end(), 1);
        want = mismatch(
            w, "rank 0 called barrier #1; " + called(others) + "all_reduce #1 (F32 x 100, sum)");
        std::vector<float> x(100, 1.0f);
        w.all_reduce(x.data(), x.size(), DType::F32).wait();
      },
      o);
}

// A collective that one process's ranks never join ends in time with TimeoutError on the others,
// naming who it waited for.
TEST_F(Hier, MissingProcessTimesOut) {
  std::mutex mu;
  std::vector<std::string> errors;
  int world_size = 0;
  CommOptions o;
  o.timeout = 1500ms;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_hierarchical(
        ranks_per_process(),
        [&](Communicator& c) {
          world_size = c.size();
          if (c.rank() / ranks_per_process() == c.size() / ranks_per_process() - 1) return;
          std::vector<float> x(1 << 16, 1.0f);
          try {
            c.all_reduce(x.data(), x.size(), DType::F32).wait();
          } catch (const TimeoutError& e) {
            std::lock_guard lk(mu);
            errors.push_back(e.what());
          } catch (const PeerFailedError& e) {  // another rank here timed out first
            std::lock_guard lk(mu);
            errors.push_back(e.what());
          }
        },
        o);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  const double ms = since_ms(t0);
  const bool last_process = errors.empty() && world_size > 0;
  if (!last_process) {
    EXPECT_EQ(static_cast<int>(errors.size()), ranks_per_process());
    bool named = false;
    for (const auto& e : errors)
      named = named || e.find("timed out after 1500 ms") != std::string::npos;
    EXPECT_TRUE(named) << (errors.empty() ? "" : errors[0]);
    EXPECT_LT(ms, 10000);
  }
}

}  // namespace
}  // namespace tessera::comm::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!tessera::comm::mpi_available())
    std::printf("SKIPPED: tessera was built without MPI; test_comm_hier has nothing to test\n");
  else if (!tessera::comm::launched_by_mpi())
    std::printf("SKIPPED: test_comm_hier must be started by mpiexec (CTest does this)\n");
  return RUN_ALL_TESTS();
}
