#include "tessera/kernels/gelu.h"

#include "grad_check.h"

namespace tessera::kernels {
namespace {

using testing::dot;
using testing::expect_fd_close;
using testing::randn;

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(Gelu, ForwardMatchesTanhForm) {
  std::vector<float> x = randn(1000, 1, 3.0f);
  x.insert(x.end(), {0.0f, -0.0f, 1e-8f, -30.0f, 30.0f, -100.0f, 100.0f, 9.0f, -9.0f});
  std::vector<float> y(x.size());
  gelu_forward(y.data(), x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double r = gelu_ref(x[i]);
    EXPECT_NEAR(y[i], r, 1e-6 + 1e-6 * std::abs(r)) << "x = " << x[i];
    EXPECT_TRUE(std::isfinite(y[i]));
  }
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  auto x = randn(200, 2, 2.0f), dout = randn(200, 3);
  std::vector<float> y(x.size()), dx(x.size());
  auto loss = [&] {
    gelu_forward(y.data(), x.data(), static_cast<int64_t>(x.size()));
    return dot(y, dout);
  };
  gelu_backward(dx.data(), dout.data(), x.data(), static_cast<int64_t>(x.size()));
  expect_fd_close(x, dx, loss, "dx", 1e-3f, 1e-2, 1e-3);
  // In place (din aliases dout).
  std::vector<float> inplace = dout;
  gelu_backward(inplace.data(), inplace.data(), x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(inplace[i], dx[i]);
}

}  // namespace
}  // namespace tessera::kernels
