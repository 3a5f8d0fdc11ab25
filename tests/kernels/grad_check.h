// Finite-difference helpers for the kernel tests. The fp32 kernels are differentiated by central
// differences of a double-accumulated scalar L = sum(w * out) with a fixed random projection w;
// the analytic gradient is the kernel's backward with dout = w.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace tessera::kernels::testing {

inline std::vector<float> randn(size_t n, uint32_t seed, float std = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * w[i];
  return s;
}

// Compares grad (analytic) against central differences of loss() with respect to x, perturbing
// every element by +-h. Each element must satisfy |g - fd| <= atol + rtol * |fd|.
inline void expect_fd_close(std::vector<float>& x, const std::vector<float>& grad,
                            const std::function<double()>& loss, const std::string& what,
                            float h = 1e-2f, double rtol = 1e-2, double atol = 2e-3) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    const double fd = (lp - lm) / (2.0 * h);
    const double err = std::abs(grad[i] - fd);
    worst = std::max(worst, err / (atol + rtol * std::abs(fd)));
    EXPECT_LE(err, atol + rtol * std::abs(fd))
        << what << "[" << i << "]: analytic " << grad[i] << " vs finite difference " << fd;
    if (::testing::Test::HasFailure()) return;
  }
  ::testing::Test::RecordProperty(what + "_worst_ratio", std::to_string(worst));
}

}  // namespace tessera::kernels::testing
