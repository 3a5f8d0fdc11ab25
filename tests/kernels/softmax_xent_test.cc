#include "tessera/kernels/softmax_xent.h"

#include "grad_check.h"

namespace tessera::kernels {
namespace {

using testing::expect_fd_close;
using testing::randn;

TEST(SoftmaxXent, LossMatchesDoubleAndGradientMatchesFiniteDifferences) {
  const int N = 5, V = 37;
  auto logits = randn(N * V, 1, 3.0f);
  logits[3] = 80.0f;  // a large logit: the max subtraction keeps it finite
  const std::vector<int32_t> targets = {3, -1, 0, 36, 17};
  const float scale = 1.0f / 4.0f;
  std::vector<float> losses(N), lse(N);
  const double total =
      softmax_xent_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  double ref_total = 0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int v = 0; v < V; ++v) mx = std::max<double>(mx, logits[n * V + v]);
    for (int v = 0; v < V; ++v) z += std::exp(logits[n * V + v] - mx);
    const double l = targets[n] < 0 ? 0.0 : mx + std::log(z) - logits[n * V + targets[n]];
    EXPECT_NEAR(losses[n], l, 1e-5 * (1 + l));
    ref_total += l;
  }
  EXPECT_NEAR(total, ref_total, 1e-5 * ref_total);
  auto loss = [&] {
    return scale *
           softmax_xent_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  };
  loss();
  std::vector<float> dlogits(N * V);
  softmax_xent_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), scale, N, V);
  for (int v = 0; v < V; ++v) EXPECT_EQ(dlogits[1 * V + v], 0.0f);  // ignored row
  expect_fd_close(logits, dlogits, loss, "dlogits", 1e-2f, 1e-2, 1e-4);
  // In place over the logits.
  loss();
  std::vector<float> inplace = logits;
  softmax_xent_backward(inplace.data(), inplace.data(), lse.data(), targets.data(), scale, N, V);
  for (int i = 0; i < N * V; ++i) EXPECT_EQ(inplace[i], dlogits[i]);
}

}  // namespace
}  // namespace tessera::kernels
