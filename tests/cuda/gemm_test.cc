#include "tessera/cuda/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/cuda/runtime.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/gemm.h"

namespace tessera::cuda {
namespace {

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<float> bf16_rounded(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  kernels::round_to_bf16(r.data(), v.data(), static_cast<int64_t>(v.size()));
  return r;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  kernels::f32_to_bf16(bits.data(), v.data(), static_cast<int64_t>(v.size()));
  std::vector<bf16> out(v.size());
  static_assert(sizeof(bf16) == sizeof(uint16_t));
  std::memcpy(static_cast<void*>(out.data()), bits.data(), sizeof(uint16_t) * bits.size());
  return out;
}

std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<uint16_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), sizeof(uint16_t) * v.size());
  std::vector<float> out(v.size());
  kernels::bf16_to_f32(out.data(), bits.data(), static_cast<int64_t>(v.size()));
  return out;
}

// A row-major problem with padded leading dimensions: stored A is [M, K] (or [K, M] transposed)
// with rows of lda > its width, likewise B; C is [M, N] with ldc > N.
struct Shape {
  bool ta, tb;
  int M, N, K;
  int lda, ldb, ldc;
  int a_rows() const { return ta ? K : M; }
  int b_rows() const { return tb ? N : K; }
  size_t a_size() const { return static_cast<size_t>(a_rows()) * lda; }
  size_t b_size() const { return static_cast<size_t>(b_rows()) * ldb; }
  size_t c_size() const { return static_cast<size_t>(M) * ldc; }
  std::string name() const {
    return "trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb);
  }
};

Shape make_shape(bool ta, bool tb, int M, int N, int K) {
  Shape s{ta, tb, M, N, K, 0, 0, 0};
  s.lda = (ta ? M : K) + 3;
  s.ldb = (tb ? K : N) + 5;
  s.ldc = N + 7;
  return s;
}

// max |got - want| / max |want| over C's M x N elements.
double relative_error(const std::vector<float>& got, const std::vector<float>& want, int M, int N,
                      int ldc) {
  double diff = 0, scale = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      const size_t k = static_cast<size_t>(i) * ldc + j;
      diff = std::max(diff, std::abs(static_cast<double>(got[k]) - want[k]));
      scale = std::max(scale, std::abs(static_cast<double>(want[k])));
      if (!std::isfinite(got[k])) return std::numeric_limits<double>::infinity();
    }
  return diff / std::max(scale, 1e-30);
}

// C's padding (the columns past N) is never written.
template <typename T>
void expect_padding_kept(const std::vector<T>& got, const std::vector<T>& before, const Shape& s) {
  for (int i = 0; i < s.M; ++i)
    for (int j = s.N; j < s.ldc; ++j) {
      const size_t k = static_cast<size_t>(i) * s.ldc + j;
      ASSERT_EQ(std::memcmp(&got[k], &before[k], sizeof(T)), 0) << "row " << i << " column " << j;
    }
}

class CudaGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
    stream_ = std::make_unique<Stream>();
    blas_ = std::make_unique<Blas>(stream_->get());
  }
  template <typename T>
  DeviceArray<T> upload(const std::vector<T>& v, const char* tag) {
    DeviceArray<T> d(alloc_, static_cast<int64_t>(v.size()), MemCategory::Buffers, tag);
    copy_to_device(d.get(), v.data(), d.bytes(), stream_->get());
    return d;
  }
  DeviceAllocator alloc_{"cuda test", 0};
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Blas> blas_;
};

const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST_F(CudaGemm, Fp32MatchesSgemmForEveryTransposeAndBeta) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(make_shape(ta, tb, 37, 53, 29).name() + " beta=" + std::to_string(beta));
        const Shape s = make_shape(ta, tb, 37, 53, 29);
        const float alpha = 0.75f;
        const auto A = uniform(s.a_size(), 1), B = uniform(s.b_size(), 2);
        // beta 0: C is not read (cuBLAS's contract), so NaNs in it must not reach the result.
        std::vector<float> C0 = uniform(s.c_size(), 3);
        std::vector<float> want = C0;
        if (beta == 0.0f) {
          for (int i = 0; i < s.M; ++i)
            for (int j = 0; j < s.N; ++j) {
              C0[static_cast<size_t>(i) * s.ldc + j] = kNaN;
              want[static_cast<size_t>(i) * s.ldc + j] = 0.0f;
            }
        }
        kernels::sgemm(ta, tb, s.M, s.N, s.K, alpha, A.data(), s.lda, B.data(), s.ldb, beta,
                       want.data(), s.ldc);
        auto dA = upload(A, "A"), dB = upload(B, "B"), dC = upload(C0, "C");
        gemm<float, float>(*blas_, ta, tb, s.M, s.N, s.K, alpha, dA.get(), s.lda, dB.get(), s.ldb,
                           beta, dC.get(), s.ldc);
        const auto got = to_host(dC.get(), dC.size(), stream_->get());
        EXPECT_LT(relative_error(got, want, s.M, s.N, s.ldc), 1e-5);
        expect_padding_kept(got, C0, s);
      }
}

TEST_F(CudaGemm, Bf16InputsWithFp32AndBf16OutputsMatchSgemmOnRoundedInputs) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(make_shape(ta, tb, 41, 35, 45).name() + " beta=" + std::to_string(beta));
        const Shape s = make_shape(ta, tb, 41, 35, 45);
        const float alpha = 1.0f;
        const auto A = bf16_rounded(uniform(s.a_size(), 4));
        const auto B = bf16_rounded(uniform(s.b_size(), 5));
        auto dA = upload(to_bf16(A), "A"), dB = upload(to_bf16(B), "B");
        // C's initial values: exact in bf16 too, so that both outputs start from the same C.
        std::vector<float> C0 = bf16_rounded(uniform(s.c_size(), 6));
        std::vector<float> want = C0;
        if (beta == 0.0f) {
          for (int i = 0; i < s.M; ++i)
            for (int j = 0; j < s.N; ++j) {
              C0[static_cast<size_t>(i) * s.ldc + j] = kNaN;
              want[static_cast<size_t>(i) * s.ldc + j] = 0.0f;
            }
        }
        kernels::sgemm(ta, tb, s.M, s.N, s.K, alpha, A.data(), s.lda, B.data(), s.ldb, beta,
                       want.data(), s.ldc);
        {  // fp32 output: products of bf16 values are exact in fp32, sums in fp32
          auto dC = upload(C0, "C");
          gemm<bf16, float>(*blas_, ta, tb, s.M, s.N, s.K, alpha, dA.get(), s.lda, dB.get(), s.ldb,
                            beta, dC.get(), s.ldc);
          const auto got = to_host(dC.get(), dC.size(), stream_->get());
          EXPECT_LT(relative_error(got, want, s.M, s.N, s.ldc), 1e-5) << "fp32 output";
          expect_padding_kept(got, C0, s);
        }
        {  // bf16 output: one rounding of each result
          const auto C0h = to_bf16(C0);
          auto dC = upload(C0h, "C");
          gemm<bf16, bf16>(*blas_, ta, tb, s.M, s.N, s.K, alpha, dA.get(), s.lda, dB.get(), s.ldb,
                           beta, dC.get(), s.ldc);
          const auto goth = to_host(dC.get(), dC.size(), stream_->get());
          EXPECT_LT(relative_error(to_f32(goth), want, s.M, s.N, s.ldc), 1e-2) << "bf16 output";
          expect_padding_kept(goth, C0h, s);
        }
      }
}

// Attention's products: `batch` matrices at fixed strides (here with gaps between them).
TEST_F(CudaGemm, BatchedMatchesALoopOfSgemm) {
  const int batch = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        const Shape s = make_shape(ta, tb, 19, 23, 17);
        SCOPED_TRACE(s.name() + " beta=" + std::to_string(beta));
        const int64_t sa = static_cast<int64_t>(s.a_size()) + 11;
        const int64_t sb = static_cast<int64_t>(s.b_size()) + 13;
        const int64_t sc = static_cast<int64_t>(s.c_size()) + 17;
        const float alpha = 0.5f;
        const auto A = uniform(static_cast<size_t>(sa * batch), 7);
        const auto B = uniform(static_cast<size_t>(sb * batch), 8);
        const auto C0 = uniform(static_cast<size_t>(sc * batch), 9);
        std::vector<float> want = C0;
        for (int b = 0; b < batch; ++b)
          kernels::sgemm(ta, tb, s.M, s.N, s.K, alpha, A.data() + b * sa, s.lda, B.data() + b * sb,
                         s.ldb, beta, want.data() + b * sc, s.ldc);
        auto dA = upload(A, "A"), dB = upload(B, "B"), dC = upload(C0, "C");
        gemm_batched<float, float>(*blas_, ta, tb, s.M, s.N, s.K, alpha, dA.get(), s.lda, sa,
                                   dB.get(), s.ldb, sb, beta, dC.get(), s.ldc, sc, batch);
        const auto got = to_host(dC.get(), dC.size(), stream_->get());
        for (int b = 0; b < batch; ++b) {
          const std::vector<float> g(got.begin() + b * sc, got.begin() + (b + 1) * sc);
          const std::vector<float> w(want.begin() + b * sc, want.begin() + (b + 1) * sc);
          EXPECT_LT(relative_error(g, w, s.M, s.N, s.ldc), 1e-5) << "matrix " << b;
        }
        // Nothing outside the matrices is written: the gaps between them and the padding.
        for (int b = 0; b < batch; ++b)
          for (int64_t k = b * sc + static_cast<int64_t>(s.c_size()); k < (b + 1) * sc; ++k)
            ASSERT_EQ(got[static_cast<size_t>(k)], C0[static_cast<size_t>(k)]) << "gap " << k;
      }
}

TEST_F(CudaGemm, BatchedBf16MatchesALoopOfSgemmOnRoundedInputs) {
  const int batch = 4;
  const Shape s = make_shape(false, true, 33, 31, 27);  // attention's scores: Q . K^T
  const int64_t sa = static_cast<int64_t>(s.a_size()), sb = static_cast<int64_t>(s.b_size()),
                sc = static_cast<int64_t>(s.c_size());
  const auto A = bf16_rounded(uniform(static_cast<size_t>(sa * batch), 10));
  const auto B = bf16_rounded(uniform(static_cast<size_t>(sb * batch), 11));
  std::vector<float> want(static_cast<size_t>(sc * batch), 0.0f);
  for (int b = 0; b < batch; ++b)
    kernels::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data() + b * sa, s.lda, B.data() + b * sb,
                   s.ldb, 0.0f, want.data() + b * sc, s.ldc);
  auto dA = upload(to_bf16(A), "A"), dB = upload(to_bf16(B), "B");
  {
    auto dC = upload(std::vector<float>(want.size(), 0.0f), "C");
    gemm_batched<bf16, float>(*blas_, s.ta, s.tb, s.M, s.N, s.K, 1.0f, dA.get(), s.lda, sa,
                              dB.get(), s.ldb, sb, 0.0f, dC.get(), s.ldc, sc, batch);
    const auto got = to_host(dC.get(), dC.size(), stream_->get());
    EXPECT_LT(relative_error(got, want, s.M * batch, s.N, s.ldc), 1e-5) << "fp32 output";
  }
  {
    auto dC = upload(to_bf16(std::vector<float>(want.size(), 0.0f)), "C");
    gemm_batched<bf16, bf16>(*blas_, s.ta, s.tb, s.M, s.N, s.K, 1.0f, dA.get(), s.lda, sa, dB.get(),
                             s.ldb, sb, 0.0f, dC.get(), s.ldc, sc, batch);
    const auto got = to_f32(to_host(dC.get(), dC.size(), stream_->get()));
    EXPECT_LT(relative_error(got, want, s.M * batch, s.N, s.ldc), 1e-2) << "bf16 output";
  }
}

TEST_F(CudaGemm, BadLeadingDimensionThrowsNamingTheCall) {
  const Shape s = make_shape(false, false, 8, 8, 8);
  auto dA = upload(uniform(s.a_size(), 12), "A"), dB = upload(uniform(s.b_size(), 13), "B"),
       dC = upload(uniform(s.c_size(), 14), "C");
  try {  // ldb below B's row width N
    gemm<float, float>(*blas_, false, false, s.M, s.N, s.K, 1.0f, dA.get(), s.lda, dB.get(), 4,
                       0.0f, dC.get(), s.ldc);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cublas: cublasGemmEx (row-major M=8 N=8 K=8"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessera::cuda
