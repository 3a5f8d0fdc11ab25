// fp32 data travelling in bf16 (comm/wire.h): what arrives is exactly the bf16 rounding of what
// was sent (gathers) or of the sum of the rounded inputs (reductions, 2 ranks: one combining step),
// in half the bytes; with an fp32 wire the functions are the plain collectives, bit for bit.
#include "tessera/comm/wire.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"

namespace tessera::comm {
namespace {

float rounded(float x) {
  return from_bf16(to_bf16(x));
}

// Values with bits below bf16's precision, different on every rank.
std::vector<float> values(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i) + 1.3f * rank) * 3.1f +
                                1e-3f * static_cast<float>(rank + 1);
  return v;
}

TEST(Wire, RoundTripsThroughBf16) {
  Allocator alloc("test");
  const std::vector<float> x = values(0, 37);
  Tensor w = to_wire(x.data(), 37, "test.wire", &alloc);
  EXPECT_EQ(w.dtype(), DType::BF16);
  EXPECT_EQ(alloc.in_use(MemCategory::Buffers), w.nbytes());
  std::vector<float> back(37, 1.0f);
  from_wire(back.data(), w, 0, 37);
  for (int i = 0; i < 37; ++i) EXPECT_EQ(back[i], rounded(x[i])) << i;
  add_from_wire(back.data() + 1, w, 5, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(back[1 + i], rounded(x[1 + i]) + rounded(x[5 + i]));
}

TEST(Wire, Bf16GatherDeliversTheRoundedSlicesInHalfTheBytes) {
  for (int ranks : {2, 3}) {
    const int64_t count = 45;
    comm::run_inproc(ranks, [&](comm::Communicator& c) {
      const std::vector<float> mine = values(c.rank(), count);
      std::vector<float> full(static_cast<size_t>(ranks * count), -7.0f);
      c.reset_traffic();
      all_gather_as(DType::BF16, c, mine.data(), full.data(), count);
      EXPECT_DOUBLE_EQ(c.traffic().all_gather, (ranks - 1.0) * count * 2);  // half the bytes
      for (int r = 0; r < ranks; ++r) {
        const std::vector<float> theirs = values(r, count);
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(full[static_cast<size_t>(r * count + i)], rounded(theirs[i])) << r << " " << i;
      }
      // In place: the slice at this rank's place of the output.
      std::vector<float> inplace(static_cast<size_t>(ranks * count), 0.0f);
      std::copy(mine.begin(), mine.end(), inplace.begin() + c.rank() * count);
      float* place = inplace.data() + c.rank() * count;
      all_gather_as(DType::BF16, c, place, inplace.data(), count);
      EXPECT_EQ(inplace, full);
      // fp32: the plain all-gather, exact, twice the bytes.
      c.reset_traffic();
      all_gather_as(DType::F32, c, mine.data(), full.data(), count);
      EXPECT_DOUBLE_EQ(c.traffic().all_gather, (ranks - 1.0) * count * 4);
      for (int64_t i = 0; i < count; ++i)
        EXPECT_EQ(full[static_cast<size_t>(c.rank() * count + i)], mine[i]);
    });
  }
}

TEST(Wire, Bf16ReductionsSumTheRoundedInputsInFp32) {
  const int64_t n = 64;  // reduce-scatter: 32 per rank
  comm::run_inproc(2, [&](comm::Communicator& c) {
    const std::vector<float> a = values(0, n), b = values(1, n);
    std::vector<float> x = values(c.rank(), n);
    c.reset_traffic();
    all_reduce_as(DType::BF16, c, x.data(), n);
    EXPECT_DOUBLE_EQ(c.traffic().all_reduce, 2.0 * 0.5 * n * 2);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], rounded(rounded(a[i]) + rounded(b[i]))) << i;

    const std::vector<float> full = values(c.rank(), n);
    std::vector<float> slice(static_cast<size_t>(n / 2));
    reduce_scatter_as(DType::BF16, c, full.data(), slice.data(), n / 2);
    EXPECT_DOUBLE_EQ(c.traffic().reduce_scatter, 0.5 * n * 2);
    for (int64_t i = 0; i < n / 2; ++i) {
      const int64_t g = c.rank() * (n / 2) + i;
      ASSERT_EQ(slice[i], rounded(rounded(a[g]) + rounded(b[g]))) << i;
    }

    std::vector<float> f32 = values(c.rank(), n);  // fp32 wire: the sum in fp32 (rank order)
    all_reduce_as(DType::F32, c, f32.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f32[i], a[i] + b[i]) << i;
  });
}

TEST(Wire, OneRankCopiesAndSendsNothing) {
  comm::run_inproc(1, [](comm::Communicator& c) {
    std::vector<float> x = values(0, 9), y(9, 0.0f);
    const std::vector<float> before = x;
    all_reduce_as(DType::BF16, c, x.data(), 9);
    EXPECT_EQ(x, before);  // nothing rounded: nothing travelled
    all_gather_as(DType::BF16, c, x.data(), y.data(), 9);
    EXPECT_EQ(y, before);
    EXPECT_EQ(c.traffic().total(), 0.0);
  });
}

}  // namespace
}  // namespace tessera::comm
