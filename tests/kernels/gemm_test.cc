#include "tessera/kernels/gemm.h"

#include "grad_check.h"

namespace tessera::kernels {
namespace {

using testing::dot;
using testing::expect_fd_close;
using testing::randn;

TEST(Gemm, ForwardWithBiasAndResidualMatchesLoops) {
  const int M = 5, K = 7, N = 3;
  auto in = randn(M * K, 1), w = randn(K * N, 2), b = randn(N, 3), r = randn(M * N, 4);
  std::vector<float> out(M * N), out_plain(M * N);
  matmul_forward(out.data(), in.data(), w.data(), b.data(), r.data(), M, K, N);
  matmul_forward(out_plain.data(), in.data(), w.data(), nullptr, nullptr, M, K, N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(in[i * K + k]) * w[k * N + j];
      EXPECT_NEAR(out_plain[i * N + j], s, 1e-5);
      EXPECT_NEAR(out[i * N + j], s + b[j] + r[i * N + j], 1e-5);
    }
  // residual aliasing out: in-place +=
  std::vector<float> acc = r;
  matmul_forward(acc.data(), in.data(), w.data(), b.data(), acc.data(), M, K, N);
  for (int i = 0; i < M * N; ++i) EXPECT_FLOAT_EQ(acc[i], out[i]);
}

TEST(Gemm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int M = 6, K = 5, N = 4;
  auto in = randn(M * K, 1), w = randn(K * N, 2), b = randn(N, 3), dout = randn(M * N, 4);
  auto loss = [&] {
    std::vector<float> out(M * N);
    matmul_forward(out.data(), in.data(), w.data(), b.data(), nullptr, M, K, N);
    return dot(out, dout);
  };
  std::vector<float> din(M * K, 7.0f), dw(K * N, 0.0f), db(N, 0.0f);
  matmul_backward(din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(), M, K, N);
  expect_fd_close(in, din, loss, "din");  // assigned: the 7s are gone
  expect_fd_close(w, dw, loss, "dweight");
  expect_fd_close(b, db, loss, "dbias");
  // Second call accumulates parameter gradients (+=) and, on request, the input gradient.
  std::vector<float> din2 = din, dw2 = dw, db2 = db;
  matmul_backward(din2.data(), dw2.data(), db2.data(), dout.data(), in.data(), w.data(), M, K, N,
                  /*accumulate_din=*/true);
  for (int i = 0; i < M * K; ++i) EXPECT_NEAR(din2[i], 2 * din[i], 1e-6 * (1 + std::abs(din[i])));
  for (int i = 0; i < K * N; ++i) EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-6 * (1 + std::abs(dw[i])));
  for (int i = 0; i < N; ++i) EXPECT_NEAR(db2[i], 2 * db[i], 1e-6 * (1 + std::abs(db[i])));
}

TEST(Gemm, TiedHeadForwardBackward) {
  const int M = 4, K = 6, N = 9;  // weight [N, K] like wte [V, C]
  auto in = randn(M * K, 5), w = randn(N * K, 6), dout = randn(M * N, 7);
  auto loss = [&] {
    std::vector<float> out(M * N);
    matmul_nt_forward(out.data(), in.data(), w.data(), M, K, N);
    return dot(out, dout);
  };
  std::vector<float> out(M * N);
  matmul_nt_forward(out.data(), in.data(), w.data(), M, K, N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(in[i * K + k]) * w[j * K + k];
      EXPECT_NEAR(out[i * N + j], s, 1e-5);
    }
  std::vector<float> din(M * K), dw(N * K, 0.0f);
  matmul_nt_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), M, K, N);
  expect_fd_close(in, din, loss, "din");
  expect_fd_close(w, dw, loss, "dweight");
}

}  // namespace
}  // namespace tessera::kernels
