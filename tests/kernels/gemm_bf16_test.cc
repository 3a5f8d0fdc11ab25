// The bf16 GEMM paths against a float64 reference of the bf16-rounded inputs (exactness up to fp32
// accumulation) and against fp32 (bf16 tolerance), and every GEMM-using kernel under bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "grad_check.h"
#include "tessera/kernels/attention.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/precision.h"

namespace tessera::kernels {
namespace {

using testing::randn;

struct Case {
  bool ta, tb;
  int M, N, K;
  float alpha, beta;
  int pad;  // extra columns in every leading dimension
};

// The element of op(X) at (i, j), X stored with leading dimension ld.
float at(const std::vector<float>& x, bool trans, int i, int j, int ld) {
  return trans ? x[static_cast<size_t>(j) * ld + i] : x[static_cast<size_t>(i) * ld + j];
}

struct Reference {
  std::vector<double> value;  // alpha * sum bf16(a) bf16(b) + beta * c, in float64
  std::vector<double> bound;  // fp32 accumulation bound: K * 2^-23 * sum |ab| + |beta c| 2^-23
  std::vector<double> scale;  // sum |a||b| of the unrounded inputs (for the bf16 tolerance)
};

Reference reference(const Case& c, const std::vector<float>& A, int lda,
                    const std::vector<float>& B, int ldb, const std::vector<float>& C0, int ldc) {
  Reference r;
  const double eps = std::ldexp(1.0, -23);
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      double s = 0, mag = 0, raw = 0;
      for (int k = 0; k < c.K; ++k) {
        float a = at(A, c.ta, i, k, lda), b = at(B, c.tb, k, j, ldb);
        raw += std::fabs(static_cast<double>(a) * b);
        round_to_bf16(&a, &a, 1);
        round_to_bf16(&b, &b, 1);
        s += static_cast<double>(a) * b;
        mag += std::fabs(static_cast<double>(a) * b);
      }
      const double prev = C0[static_cast<size_t>(i) * ldc + j];
      r.value.push_back(c.alpha * s + c.beta * prev);
      r.bound.push_back((c.K + 2) * eps * std::fabs(c.alpha) * mag +
                        2 * eps * std::fabs(c.beta * prev));
      r.scale.push_back(std::fabs(c.alpha) * raw);
    }
  return r;
}

const Case kCases[] = {
    {false, false, 7, 5, 33, 1.0f, 0.0f, 0},   {false, true, 16, 9, 64, 0.125f, 0.0f, 3},
    {true, false, 5, 12, 40, 1.0f, 1.0f, 2},   {true, true, 3, 4, 17, -2.0f, 0.5f, 1},
    {false, false, 64, 48, 96, 1.0f, 1.0f, 5}, {false, true, 1, 1, 1, 1.0f, 0.0f, 0},
};

void check_path(Bf16Gemm path) {
  for (const Case& c : kCases) {
    const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
    const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
    const int lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
    const auto A = randn(static_cast<size_t>(a_rows) * lda, 11 + c.M);
    const auto B = randn(static_cast<size_t>(b_rows) * ldb, 23 + c.N);
    const auto C0 = randn(static_cast<size_t>(c.M) * ldc, 37 + c.K);
    const Reference ref = reference(c, A, lda, B, ldb, C0, ldc);
    std::vector<float> C = C0, F = C0;
    const std::vector<float> A_before = A, B_before = B;
    gemm_bf16(path, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta,
              C.data(), ldc);
    sgemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, F.data(), ldc);
    EXPECT_EQ(A, A_before);  // inputs untouched
    EXPECT_EQ(B, B_before);
    const std::string what = std::string(to_string(path)) + " case M=" + std::to_string(c.M) +
                             " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K);
    double worst_exact = 0, worst_fp32 = 0;
    for (int i = 0; i < c.M; ++i)
      for (int j = 0; j < c.N; ++j) {
        const size_t o = static_cast<size_t>(i) * ldc + j, e = static_cast<size_t>(i) * c.N + j;
        const double err = std::fabs(C[o] - ref.value[e]);
        ASSERT_LE(err, ref.bound[e]) << what << " (" << i << "," << j << ")";
        worst_exact = std::max(worst_exact, err / ref.bound[e]);
        // Against fp32: each input moves by at most 2^-9 relative, so a product by 2^-8.
        const double tol = std::ldexp(1.0, -8) * ref.scale[e] + 1e-6 * (1 + std::fabs(F[o]));
        ASSERT_LE(std::fabs(C[o] - F[o]), tol) << what;
        worst_fp32 = std::max(worst_fp32, std::fabs(C[o] - F[o]) / tol);
      }
    // Columns beyond N in each row of C (the padding) are not written.
    for (int i = 0; i < c.M; ++i)
      for (int j = c.N; j < ldc; ++j)
        ASSERT_EQ(C[static_cast<size_t>(i) * ldc + j], C0[static_cast<size_t>(i) * ldc + j]);
    ::testing::Test::RecordProperty(what + " worst/bound", std::to_string(worst_exact));
  }
}

TEST(GemmBf16, EmulatedIsExactUpToFp32Accumulation) {
  check_path(Bf16Gemm::Emulated);
}

TEST(GemmBf16, OneDnnIsExactUpToFp32Accumulation) {
  std::string why;
  if (!onednn_bf16_usable(&why)) GTEST_SKIP() << "oneDNN bf16 path unavailable: " << why;
  check_path(Bf16Gemm::OneDnn);
}

TEST(GemmBf16, EmptyShapesKeepTheBetaContract) {
  std::vector<float> C = {2, 4};
  gemm_bf16(Bf16Gemm::Auto, false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{1, 2}));
}

TEST(GemmBf16, GemmFollowsTheThreadsMode) {
  const int M = 6, K = 10, N = 4;
  const auto A = randn(M * K, 1), B = randn(K * N, 2);
  std::vector<float> fp32(M * N), direct(M * N), scoped(M * N);
  gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, fp32.data(), N);
  gemm_bf16(Bf16Gemm::Emulated, false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f,
            direct.data(), N);
  {
    GemmModeScope bf16({Precision::BF16, Bf16Gemm::Emulated});
    gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, scoped.data(), N);
  }
  EXPECT_EQ(scoped, direct);
  EXPECT_NE(scoped, fp32);  // random inputs are not bf16 values: rounding shows
}

// Every GEMM-using kernel under bf16 against itself under fp32, within bf16 tolerance relative to
// the output's scale (the inputs are unit normal).
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

class KernelsUnderBf16 : public ::testing::TestWithParam<Bf16Gemm> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam() == Bf16Gemm::OneDnn && !onednn_bf16_usable(&why)) GTEST_SKIP() << why;
  }
  template <typename F>
  void compare(const char* what, F run) {
    std::vector<std::vector<float>> f32 = run();
    std::vector<std::vector<float>> b16;
    {
      GemmModeScope scope({Precision::BF16, GetParam()});
      b16 = run();
    }
    for (size_t i = 0; i < f32.size(); ++i) {
      const double d = max_rel_diff(b16[i], f32[i]);
      EXPECT_LT(d, 2e-2) << what << " output " << i;
      EXPECT_GT(d, 0.0) << what << " output " << i << ": bf16 made no difference";
      RecordProperty(std::string(what) + std::to_string(i), std::to_string(d));
    }
  }
};

TEST_P(KernelsUnderBf16, MatmulForwardBackward) {
  const int M = 24, K = 48, N = 40;
  const auto in = randn(M * K, 1), w = randn(K * N, 2), b = randn(N, 3), dout = randn(M * N, 4);
  compare("matmul", [&] {
    std::vector<float> out(M * N), din(M * K), dw(K * N, 0.5f), db(N, 0.0f);
    matmul_forward(out.data(), in.data(), w.data(), b.data(), nullptr, M, K, N);
    matmul_backward(din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(), M, K, N);
    return std::vector<std::vector<float>>{out, din, dw};
  });
}

TEST_P(KernelsUnderBf16, TiedHeadForwardBackward) {
  const int M = 12, K = 32, N = 50;
  const auto in = randn(M * K, 5), w = randn(N * K, 6), dout = randn(M * N, 7);
  compare("matmul_nt", [&] {
    std::vector<float> out(M * N), din(M * K), dw(N * K, 0.0f);
    matmul_nt_forward(out.data(), in.data(), w.data(), M, K, N);
    matmul_nt_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), M, K, N);
    return std::vector<std::vector<float>>{out, din, dw};
  });
}

TEST_P(KernelsUnderBf16, AttentionForwardBackward) {
  const int B = 2, T = 80, C = 32, NH = 4;  // T spans more than one attention block
  const auto qkv = randn(static_cast<size_t>(B) * T * 3 * C, 8);
  const auto dout = randn(static_cast<size_t>(B) * T * C, 9);
  compare("attention", [&] {
    std::vector<float> out(B * T * C), att(static_cast<size_t>(B) * NH * T * T);
    std::vector<float> dqkv(qkv.size()), scratch(T * T);
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), B, T, C, NH);
    attention_backward(dqkv.data(), scratch.data(), dout.data(), att.data(), nullptr, qkv.data(), B,
                       T, C, NH);
    return std::vector<std::vector<float>>{out, dqkv};
  });
}

// A GEMM input given in bf16 (the bits) gives bitwise the GEMM of the fp32 values it rounds: for
// gemm_bf16 with either or both inputs in bf16 on every case (leading dimensions, transposes), and
// for the matmuls with bf16 inputs and weights (a record's kept activations, a weight's copy).
TEST_P(KernelsUnderBf16, Bf16InputsGiveTheGemmOfTheRoundedValues) {
  auto bits = [](const std::vector<float>& x) {
    std::vector<uint16_t> b(x.size());
    f32_to_bf16(b.data(), x.data(), static_cast<int64_t>(x.size()));
    return b;
  };
  for (const Case& c : kCases) {
    const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
    const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
    const int lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
    const auto A = randn(static_cast<size_t>(a_rows) * lda, 41 + c.M);
    const auto B = randn(static_cast<size_t>(b_rows) * ldb, 43 + c.N);
    const auto C0 = randn(static_cast<size_t>(c.M) * ldc, 47 + c.K);
    const std::vector<uint16_t> A16 = bits(A), B16 = bits(B);
    std::vector<float> from_f32 = C0;
    gemm_bf16(GetParam(), c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta,
              from_f32.data(), ldc);
    const GemmInput as[] = {A.data(), A16.data()}, bs[] = {B.data(), B16.data()};
    for (int mix = 1; mix < 4; ++mix) {  // A in bf16, B in bf16, both
      std::vector<float> out = C0;
      gemm_bf16(GetParam(), c.ta, c.tb, c.M, c.N, c.K, c.alpha, as[mix & 1], lda, bs[mix >> 1], ldb,
                c.beta, out.data(), ldc);
      EXPECT_EQ(out, from_f32) << "M=" << c.M << " N=" << c.N << " K=" << c.K << " mix " << mix;
    }
  }
  const int M = 24, K = 48, N = 40;
  const auto in = randn(M * K, 10), w = randn(K * N, 12), dout = randn(M * N, 11);
  const auto bias = randn(N, 13), residual = randn(M * N, 14);
  const std::vector<uint16_t> in16 = bits(in), w16 = bits(w);
  GemmModeScope scope({Precision::BF16, GetParam()});
  std::vector<float> out(M * N), out16(M * N);
  matmul_forward(out.data(), in.data(), w.data(), bias.data(), residual.data(), M, K, N);
  matmul_forward(out16.data(), in16.data(), w16.data(), bias.data(), residual.data(), M, K, N);
  EXPECT_EQ(out16, out);
  std::vector<float> din(M * K), dw(K * N, 0.5f), db(N, 0.25f);
  std::vector<float> din16 = din, dw16 = dw, db16 = db;
  matmul_backward(din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(), M, K, N);
  matmul_backward(din16.data(), dw16.data(), db16.data(), dout.data(), in16.data(), w16.data(), M,
                  K, N);
  EXPECT_EQ(din16, din);
  EXPECT_EQ(dw16, dw);
  EXPECT_EQ(db16, db);
  // The tied head's [N, K] weight.
  std::vector<float> logits(M * N), logits16(M * N), dnt(M * K), dnt16(M * K);
  const auto wt = randn(N * K, 15);
  const std::vector<uint16_t> wt16 = bits(wt);
  matmul_nt_forward(logits.data(), in.data(), wt.data(), M, K, N);
  matmul_nt_forward(logits16.data(), in16.data(), wt16.data(), M, K, N);
  EXPECT_EQ(logits16, logits);
  matmul_nt_backward(dnt.data(), nullptr, dout.data(), nullptr, wt.data(), M, K, N);
  matmul_nt_backward(dnt16.data(), nullptr, dout.data(), nullptr, wt16.data(), M, K, N);
  EXPECT_EQ(dnt16, dnt);
}

// bf16 inputs belong to the bf16 GEMM mode: an fp32 GEMM refuses them.
TEST(GemmInputs, Bf16BitsOutsideTheBf16ModeAreRefused) {
  std::vector<uint16_t> a(4, 0x3f80);
  std::vector<float> b(4, 1.0f), c(4, 0.0f);
  EXPECT_THROW(gemm(false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2),
               std::exception);
}

INSTANTIATE_TEST_SUITE_P(Paths, KernelsUnderBf16,
                         ::testing::Values(Bf16Gemm::Emulated, Bf16Gemm::OneDnn),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace tessera::kernels
