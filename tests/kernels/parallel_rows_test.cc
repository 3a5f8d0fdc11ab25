#include "tessera/kernels/parallel_rows.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "compute_threads.h"
#include "tessera/kernels/bf16.h"

namespace tessera::kernels {
namespace {

using tessera::testing::ComputeThreads;

// Every row exactly once, in pieces of whole rows; threads only from the threshold on.
TEST(ParallelRows, CoversEveryRowOnceAndUsesThreadsOnlyForLargeWork) {
  ComputeThreads three(3);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{0, 5},
                            {1, kParallelRowsMinElements},
                            {2, kParallelRowsMinElements},
                            {7, kParallelRowsMinElements / 4},
                            {1000, 10},
                            {kParallelRowsMinElements, 1}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    std::vector<std::atomic<int>> seen(static_cast<size_t>(rows));
    std::mutex m;
    std::set<std::thread::id> ids;
    int calls = 0;
    parallel_rows(rows, cols, [&](int64_t first, int64_t end) {
      EXPECT_LT(first, end);
      for (int64_t r = first; r < end; ++r) seen[static_cast<size_t>(r)]++;
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
      ++calls;
    });
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(seen[static_cast<size_t>(r)], 1) << "row " << r;
    const bool large = rows * cols >= kParallelRowsMinElements;
    EXPECT_EQ(calls, rows == 0 ? 0 : large ? std::min<int64_t>(rows, 3) : 1);
    EXPECT_EQ(static_cast<int>(ids.size()), calls);
  }
}

// The conversions of a large strided matrix on 2 compute threads are bitwise one thread's.
TEST(ParallelRows, ConversionsOnThreadsEqualOneThread) {
  const int64_t rows = 700, cols = 1600, ld = 1700;  // 1.12M elements
  std::vector<float> in(static_cast<size_t>(rows * ld));
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : in) v = normal(gen);
  std::vector<uint16_t> bits(in.size());
  f32_to_bf16(bits.data(), in.data(), static_cast<int64_t>(in.size()));
  auto run = [&](int threads) {
    ComputeThreads t(threads);
    std::vector<float> rounded(static_cast<size_t>(rows * cols)), widened(rounded.size());
    std::vector<uint16_t> converted(rounded.size());
    round_to_bf16_rows(rounded.data(), in.data(), rows, cols, ld);
    f32_to_bf16_rows(converted.data(), in.data(), rows, cols, ld);
    bf16_to_f32_rows(widened.data(), bits.data(), rows, cols, ld);
    return std::make_tuple(rounded, converted, widened);
  };
  const auto [r1, c1, w1] = run(1);
  const auto [r2, c2, w2] = run(2);
  EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * 4), 0);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(std::memcmp(w1.data(), w2.data(), w1.size() * 4), 0);
  // And they are the conversions: row 5, column 9 of each.
  const size_t at = 5 * ld + 9, dense = 5 * cols + 9;
  uint32_t u;
  std::memcpy(&u, &r1[dense], 4);
  EXPECT_EQ(u >> 16, c1[dense]);
  EXPECT_EQ(c1[dense], bits[at]);
  std::memcpy(&u, &w1[dense], 4);
  EXPECT_EQ(u, static_cast<uint32_t>(bits[at]) << 16);
}

}  // namespace
}  // namespace tessera::kernels
