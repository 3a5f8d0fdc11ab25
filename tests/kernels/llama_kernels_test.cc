// The kernels of the Llama family (RMSNorm, rotary embeddings, SwiGLU) against float64
// transcriptions of their definitions (Hugging Face's LlamaRMSNorm, rotate_half convention and
// "llama3" frequency scaling; SwiGLU) and their backwards against finite differences.
#include <cmath>
#include <numbers>
#include <vector>

#include "grad_check.h"
#include "tessera/kernels/rmsnorm.h"
#include "tessera/kernels/rope.h"
#include "tessera/kernels/swiglu.h"

namespace tessera::kernels {
namespace {

using testing::dot;
using testing::expect_fd_close;
using testing::randn;

TEST(RmsNorm, ForwardMatchesDefinition) {
  const int N = 3, C = 37;
  auto x = randn(N * C, 1, 3.0f), w = randn(C, 2);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += static_cast<double>(x[n * C + c]) * x[n * C + c];
    const double r = 1.0 / std::sqrt(ms / C + 1e-6);
    EXPECT_NEAR(rstd[n], r, 1e-6 * r);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[n * C + c], x[n * C + c] * r * w[c], 1e-5);
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 4, C = 16;
  auto x = randn(N * C, 4), w = randn(C, 5), dout = randn(N * C, 7);
  std::vector<float> out(N * C), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    return dot(out, dout);
  };
  loss();
  const std::vector<float> prior(N * C, 0.5f);
  std::vector<float> dx = prior, dw(C, 0.25f);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) dx[i] -= prior[i];  // din accumulates onto what was there
  for (float& g : dw) g -= 0.25f;                     // and so does dweight
  expect_fd_close(x, dx, loss, "dx");
  expect_fd_close(w, dw, loss, "dweight");
}

// Hugging Face's default and llama3 inverse frequencies, in double.
std::vector<double> reference_inv_freq(int d, double theta, const RopeScaling& s) {
  std::vector<double> f(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    f[i] = 1.0 / std::pow(theta, (2.0 * i) / d);
    if (s.factor <= 0) continue;
    const double wl = 2 * std::numbers::pi / f[i];
    const double lo = s.original_max_positions / s.low_freq_factor;
    const double hi = s.original_max_positions / s.high_freq_factor;
    if (wl < hi) continue;
    if (wl > lo) {
      f[i] /= s.factor;
      continue;
    }
    const double smooth = (s.original_max_positions / wl - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
    f[i] = (1 - smooth) * f[i] / s.factor + smooth * f[i];
  }
  return f;
}

TEST(Rope, InverseFrequenciesPlainAndLlama3Scaled) {
  const int d = 128;
  std::vector<float> got(d / 2);
  rope_inverse_frequencies(got.data(), d, 500000.0);
  const std::vector<double> plain = reference_inv_freq(d, 500000.0, {});
  for (int i = 0; i < d / 2; ++i) EXPECT_NEAR(got[i], plain[i], 1e-7 * plain[i]) << i;
  const RopeScaling llama3{8.0, 1.0, 4.0, 8192.0};  // Llama 3.1's config.json
  rope_inverse_frequencies(got.data(), d, 500000.0, llama3);
  const std::vector<double> scaled = reference_inv_freq(d, 500000.0, llama3);
  int divided = 0, kept = 0, smoothed = 0;
  for (int i = 0; i < d / 2; ++i) {
    EXPECT_NEAR(got[i], scaled[i], 1e-7 * scaled[i]) << i;
    divided += std::abs(scaled[i] * 8.0 - plain[i]) < 1e-12 * plain[i];
    kept += scaled[i] == plain[i];
  }
  smoothed = d / 2 - divided - kept;
  EXPECT_GT(divided, 0);  // the three regimes all occur at d = 128
  EXPECT_GT(kept, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(Rope, RotatesHalfPairsByThePositionsAngleAndInverts) {
  const int heads = 3, d = 8, rows = 5;
  const int64_t ld = heads * d + 4;  // rows wider than the heads (e.g. q inside a fused qkv)
  const std::vector<int64_t> pos = {0, 7, 3, 11, 2};  // any order: context-parallel permutations
  std::vector<float> inv(d / 2), cos(12 * d / 2), sin(12 * d / 2);
  rope_inverse_frequencies(inv.data(), d, 10000.0);
  rope_tables(cos.data(), sin.data(), inv.data(), d, 12);
  const std::vector<float> x0 = randn(rows * ld, 9);
  std::vector<float> x = x0;
  rope_apply(x.data(), rows, heads, d, ld, pos.data(), cos.data(), sin.data());
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const double angle = pos[r] * std::pow(10000.0, -2.0 * i / d);
        const double a = x0[r * ld + h * d + i], b = x0[r * ld + h * d + i + d / 2];
        EXPECT_NEAR(x[r * ld + h * d + i], a * std::cos(angle) - b * std::sin(angle), 1e-5);
        EXPECT_NEAR(x[r * ld + h * d + i + d / 2], b * std::cos(angle) + a * std::sin(angle), 1e-5);
      }
    for (int64_t c = heads * d; c < ld; ++c) EXPECT_EQ(x[r * ld + c], x0[r * ld + c]);  // untouched
  }
  // The backward is the inverse rotation: it restores the input (to rounding).
  rope_apply(x.data(), rows, heads, d, ld, pos.data(), cos.data(), sin.data(), /*inverse=*/true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], x0[i], 1e-5) << i;
}

TEST(Rope, InverseIsTheGradient) {
  const int heads = 2, d = 6, rows = 3;
  const std::vector<int64_t> pos = {4, 1, 9};
  std::vector<float> inv(d / 2), cos(10 * d / 2), sin(10 * d / 2);
  rope_inverse_frequencies(inv.data(), d, 10000.0);
  rope_tables(cos.data(), sin.data(), inv.data(), d, 10);
  auto x = randn(rows * heads * d, 3), dout = randn(rows * heads * d, 4);
  auto loss = [&] {
    std::vector<float> y = x;
    rope_apply(y.data(), rows, heads, d, heads * d, pos.data(), cos.data(), sin.data());
    return dot(y, dout);
  };
  std::vector<float> dx = dout;
  rope_apply(dx.data(), rows, heads, d, heads * d, pos.data(), cos.data(), sin.data(), true);
  expect_fd_close(x, dx, loss, "dx");
}

TEST(SwiGlu, ForwardMatchesDefinition) {
  const int rows = 3, cols = 21, ld = 2 * cols;  // a fused [rows, 2 cols] gate-up projection
  auto gu = randn(rows * ld, 11, 3.0f);
  std::vector<float> out(rows * cols);
  swiglu_forward(out.data(), gu.data(), gu.data() + cols, rows, cols, ld);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const double g = gu[r * ld + c], u = gu[r * ld + cols + c];
      const double want = g / (1 + std::exp(-g)) * u;
      EXPECT_NEAR(out[r * cols + c], want, 1e-5 * (1 + std::abs(want)));
    }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferencesAlsoInPlace) {
  const int rows = 2, cols = 9, ld = 2 * cols;
  auto gu = randn(rows * ld, 12, 2.0f), dout = randn(rows * cols, 13);
  std::vector<float> out(rows * cols);
  auto loss = [&] {
    swiglu_forward(out.data(), gu.data(), gu.data() + cols, rows, cols, ld);
    return dot(out, dout);
  };
  std::vector<float> dgu(rows * ld);
  swiglu_backward(dgu.data(), dgu.data() + cols, dout.data(), gu.data(), gu.data() + cols, rows,
                  cols, ld);
  expect_fd_close(gu, dgu, loss, "dgate_up");
  std::vector<float> in_place = gu;  // the gradients written over the activations they read
  swiglu_backward(in_place.data(), in_place.data() + cols, dout.data(), in_place.data(),
                  in_place.data() + cols, rows, cols, ld);
  for (size_t i = 0; i < dgu.size(); ++i) EXPECT_EQ(in_place[i], dgu[i]) << i;
}

}  // namespace
}  // namespace tessera::kernels
