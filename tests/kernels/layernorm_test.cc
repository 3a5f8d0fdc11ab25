#include "tessera/kernels/layernorm.h"

#include "grad_check.h"

namespace tessera::kernels {
namespace {

using testing::dot;
using testing::expect_fd_close;
using testing::randn;

TEST(LayerNorm, ForwardMatchesDefinition) {
  const int N = 3, C = 37;
  auto x = randn(N * C, 1), w = randn(C, 2), b = randn(C, 3);
  for (float& v : x) v += 100.0f;  // large mean: the two-pass variance must not cancel
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                    1e-5f);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    EXPECT_NEAR(mean[n], m, 1e-4);
    EXPECT_NEAR(rstd[n], s, 1e-4 * s);
    for (int c = 0; c < C; ++c)
      EXPECT_NEAR(out[n * C + c], (x[n * C + c] - m) * s * w[c] + b[c], 2e-4);
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 4, C = 16;
  auto x = randn(N * C, 4), w = randn(C, 5), b = randn(C, 6), dout = randn(N * C, 7);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                      1e-5f);
    return dot(out, dout);
  };
  loss();
  const std::vector<float> prior(N * C, 0.5f);
  std::vector<float> dx = prior, dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) dx[i] -= prior[i];  // din accumulates onto what was there
  expect_fd_close(x, dx, loss, "dx");
  expect_fd_close(w, dw, loss, "dweight");
  expect_fd_close(b, db, loss, "dbias");
}

}  // namespace
}  // namespace tessera::kernels
