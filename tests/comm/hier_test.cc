// The hierarchical backend (several thread ranks per MPI process), run by CTest under mpiexec with
// TESSERA_TEST_RANKS_PER_PROCESS ranks in each process (default 2). Every process runs the same
// tests in the same order. Skips (saying why) when built without MPI or not launched by mpiexec.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "helpers.h"
#include "tessera/comm/reduce.h"

namespace tessera::comm::test {
namespace {

using namespace std::chrono_literals;

int ranks_per_process() {
  const char* v = std::getenv("TESSERA_TEST_RANKS_PER_PROCESS");
  return v && std::atoi(v) > 0 ? std::atoi(v) : 2;
}

// Runs fn on every rank of a fresh hierarchical world; fails the test with the first error.
void on_world(const std::function<void(Communicator&)>& fn, Timeout timeout = 60s) {
  CommOptions o;
  o.timeout = timeout;
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
