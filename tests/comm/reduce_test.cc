// The reduction kernels behind the inproc all-reduce: every destination gets the same bits,
// streaming or not, at any alignment, in place, for every dtype and op.
#include "tessera/comm/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tessera::comm::detail {
namespace {

// Sources with values that make every op and rounding visible; rank j, element i.
std::vector<float> source(int j, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = static_cast<float>((i * 7 + static_cast<size_t>(j) * 13) % 23) * 0.37f - 3.1f;
  return v;
}

// `count` floats that start `offset` floats past a 64-byte boundary, between -99 guards.
struct Guarded {
  std::vector<float> mem;
  float* p;
  Guarded(size_t count, size_t offset) : mem(count + offset + 32, -99.f) {
    size_t base = 1;  // at least one guard in front
    while (reinterpret_cast<uintptr_t>(mem.data() + base) % 64 != 0) ++base;
    p = mem.data() + base + offset;
  }
};

// Counts around the kernel's 1024-element block and 64-byte line; destinations misaligned
// against 64 bytes all alike (the streaming fast path) or each differently (the fallback).
class ReduceTo : public ::testing::TestWithParam<std::tuple<size_t, size_t, bool, bool>> {};

TEST_P(ReduceTo, EveryDestinationEqualsTheOneDestinationKernel) {
  const auto [count, offset, streaming, alike] = GetParam();
  const int k = 3;
  std::vector<std::vector<float>> src;
  for (int j = 0; j < k; ++j) src.push_back(source(j, count));
  const void* srcs[k] = {src[0].data(), src[1].data(), src[2].data()};
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
    std::vector<float> ref(count + 1);
    reduce_n(ref.data(), srcs, k, count, DType::F32, op, k);
    std::vector<Guarded> out;
    void* dsts[3];
    for (size_t d = 0; d < 3; ++d) {
      out.emplace_back(count, offset + (alike ? 0 : d));
      dsts[d] = out.back().p;
    }
    reduce_n_to(dsts, 3, streaming, srcs, k, count, DType::F32, op, k);
    store_fence();
    for (int d = 0; d < 3; ++d) {
      const float* o = static_cast<float*>(dsts[d]);
      ASSERT_EQ(std::memcmp(o, ref.data(), count * sizeof(float)), 0) << "destination " << d;
      EXPECT_EQ(o[count], -99.f) << "wrote past the end of destination " << d;
      EXPECT_EQ(o[-1], -99.f) << "wrote before destination " << d;
    }
    // Spot-check the reference itself: element 5.
    if (count > 5) {
      float e[k];
      for (int j = 0; j < k; ++j) e[j] = src[j][5];
      float want = e[0];
      for (int j = 1; j < k; ++j)
        want = op == ReduceOp::Max   ? std::max(want, e[j])
               : op == ReduceOp::Min ? std::min(want, e[j])
                                     : want + e[j];
      if (op == ReduceOp::Mean) want /= k;
      EXPECT_EQ(ref[5], want);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReduceTo,
                         ::testing::Combine(::testing::Values(size_t{1}, size_t{15}, size_t{16},
                                                              size_t{17}, size_t{1023},
                                                              size_t{1025}, size_t{5000}),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{5}),
                                            ::testing::Bool(), ::testing::Bool()));

TEST(ReduceTo, InPlaceOnEveryDestinationReadsAllSourcesFirst) {
  // Destinations are the sources themselves (an in-place all-reduce seen by one rank).
  const size_t count = 3000;
  std::vector<float> a = source(0, count), b = source(1, count), want(count);
  const void* srcs[2] = {a.data(), b.data()};
  reduce_n(want.data(), srcs, 2, count, DType::F32, ReduceOp::Sum, 0);
  void* dsts[2] = {a.data(), b.data()};
  reduce_n_to(dsts, 2, true, srcs, 2, count, DType::F32, ReduceOp::Sum, 0);
  store_fence();
  EXPECT_EQ(a, want);
  EXPECT_EQ(b, want);
}

TEST(ReduceTo, IntegerAndBf16Dtypes) {
  const size_t count = 2500;
  std::vector<int64_t> x(count), y(count);
  std::vector<int32_t> p(count), q(count);
  std::vector<uint16_t> u(count), w(count);
  for (size_t i = 0; i < count; ++i) {
    x[i] = static_cast<int64_t>(i) * 1'000'000'007LL;
    y[i] = -static_cast<int64_t>(i);
    p[i] = static_cast<int32_t>(i % 97) - 40;
    q[i] = static_cast<int32_t>(i % 31);
    u[i] = to_bf16(static_cast<float>(i % 50) * 0.5f).bits;
    w[i] = to_bf16(1.0f).bits;
  }
  std::vector<int64_t> o64(count);
  std::vector<int32_t> o32a(count), o32b(count + 3);
  std::vector<uint16_t> obf(count);
  const void* s64[2] = {x.data(), y.data()};
  void* d64[1] = {o64.data()};
  reduce_n_to(d64, 1, true, s64, 2, count, DType::I64, ReduceOp::Sum, 0);
  const void* s32[2] = {p.data(), q.data()};
  void* d32[2] = {o32a.data(), o32b.data() + 3};
  reduce_n_to(d32, 2, true, s32, 2, count, DType::I32, ReduceOp::Max, 0);
  const void* sbf[2] = {u.data(), w.data()};
  void* dbf[1] = {obf.data()};
  reduce_n_to(dbf, 1, true, sbf, 2, count, DType::BF16, ReduceOp::Sum, 0);
  store_fence();
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(o64[i], x[i] + y[i]) << i;
    ASSERT_EQ(o32a[i], std::max(p[i], q[i])) << i;
    ASSERT_EQ(o32b[i + 3], o32a[i]) << i;
    ASSERT_EQ(obf[i], to_bf16(static_cast<float>(i % 50) * 0.5f + 1.0f).bits) << i;
  }
}

TEST(ReduceTo, F64EveryOpStreamingOrNot) {
  // 3 sources; values whose sums need double precision; destinations aligned and not.
  const size_t count = 2051;
  std::vector<std::vector<double>> src(3, std::vector<double>(count));
  for (int j = 0; j < 3; ++j)
    for (size_t i = 0; i < count; ++i)
      src[j][i] = 1e8 + static_cast<double>((i * 7 + static_cast<size_t>(j) * 13) % 23) * 1e-7 -
                  static_cast<double>(j);
  const void* srcs[3] = {src[0].data(), src[1].data(), src[2].data()};
  for (bool streaming : {false, true}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
      std::vector<double> a(count + 8, -99.0), b(count + 8, -99.0);
      void* dsts[2] = {a.data(), b.data() + 3};
      reduce_n_to(dsts, 2, streaming, srcs, 3, count, DType::F64, op, 3);
      store_fence();
      for (size_t i = 0; i < count; ++i) {
        double want = src[0][i];
        for (int j = 1; j < 3; ++j)
          want = op == ReduceOp::Max   ? std::max(want, src[j][i])
                 : op == ReduceOp::Min ? std::min(want, src[j][i])
                                       : want + src[j][i];
        if (op == ReduceOp::Mean) want /= 3;
        ASSERT_EQ(a[i], want) << "op " << static_cast<int>(op) << " element " << i;
        ASSERT_EQ(b[i + 3], want) << "op " << static_cast<int>(op) << " element " << i;
      }
      EXPECT_EQ(a[count], -99.0);
      EXPECT_EQ(b[2], -99.0);
      EXPECT_EQ(b[count + 3], -99.0);
    }
  }
  // divide (the MPI backend's Mean) in place.
  std::vector<double> x = {3.0, 1e-300, -7.5};
  divide(x.data(), x.size(), DType::F64, 3);
  EXPECT_EQ(x[0], 1.0);
  EXPECT_EQ(x[1], 1e-300 / 3);
  EXPECT_EQ(x[2], -2.5);
}

}  // namespace
}  // namespace tessera::comm::detail
