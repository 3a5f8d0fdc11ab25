#include "tessera/kernels/dropout.h"

#include "grad_check.h"
#include "tessera/kernels/residual.h"

namespace tessera::kernels {
namespace {

using testing::randn;

TEST(Dropout, ZeroProbabilityIsExactIdentity) {
  auto x = randn(100, 1);
  std::vector<float> y(100, -1.0f);
  std::vector<uint8_t> mask(100, 7);
  dropout_forward_btc(y.data(), mask.data(), x.data(), 2, 5, 10, 0.0f, 1, 2, 0);
  EXPECT_EQ(x, y);
  for (uint8_t m : mask) EXPECT_EQ(m, 1);
  std::vector<float> dx(100);
  dropout_backward(dx.data(), x.data(), mask.data(), 100, 0.0f);
  EXPECT_EQ(dx, x);
}

TEST(Dropout, KeepsAboutOneMinusPAndRescales) {
  const int n = 100000;
  std::vector<float> x(n, 1.0f), y(n);
  std::vector<uint8_t> mask(n);
  dropout_forward_btc(y.data(), mask.data(), x.data(), 1, 1, n, 0.25f, 42, mix_stream(3, 7), 0);
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    kept += mask[i];
    EXPECT_EQ(y[i], mask[i] ? 1.0f / 0.75f : 0.0f);
  }
  EXPECT_NEAR(kept / static_cast<double>(n), 0.75, 0.01);
  std::vector<float> dy(n, 2.0f), dx(n);
  dropout_backward(dx.data(), dy.data(), mask.data(), n, 0.25f);
  for (int i = 0; i < n; ++i) EXPECT_EQ(dx[i], mask[i] ? 2.0f / 0.75f : 0.0f);
}

TEST(Dropout, RowAndColumnShardsReproduceTheFullBatchMask) {
  const int B = 6, T = 5, C = 12;
  const float p = 0.4f;
  const uint64_t seed = 9, stream = mix_stream(17, stable_hash("h.0.mlp.dropout"));
  auto x = randn(B * T * C, 3);
  std::vector<float> full(B * T * C);
  std::vector<uint8_t> mfull(B * T * C);
  dropout_forward_btc(full.data(), mfull.data(), x.data(), B, T, C, p, seed, stream, 0);
  // Rows [2, 5): a data-parallel rank or a micro-batch holding global samples 2, 3, 4.
  const int s0 = 2, Bs = 3;
  std::vector<float> part(Bs * T * C);
  std::vector<uint8_t> mpart(Bs * T * C);
  dropout_forward_btc(part.data(), mpart.data(), x.data() + s0 * T * C, Bs, T, C, p, seed, stream,
                      s0);
  for (int i = 0; i < Bs * T * C; ++i) {
    ASSERT_EQ(part[i], full[s0 * T * C + i]);
    ASSERT_EQ(mpart[i], mfull[s0 * T * C + i]);
  }
  // Columns [4, 8) of every row: a feature shard.
  const int c0 = 4, Cs = 4;
  std::vector<float> xs(B * T * Cs), cs(B * T * Cs);
  for (int r = 0; r < B * T; ++r)
    for (int c = 0; c < Cs; ++c) xs[r * Cs + c] = x[r * C + c0 + c];
  dropout_forward_btc(cs.data(), nullptr, xs.data(), B, T, Cs, p, seed, stream, 0, c0, C);
  for (int r = 0; r < B * T; ++r)
    for (int c = 0; c < Cs; ++c) ASSERT_EQ(cs[r * Cs + c], full[r * C + c0 + c]);
  // The general form with an explicit index map gives the same numbers.
  std::vector<float> gen(B * T * C);
  dropout_forward(gen.data(), nullptr, x.data(), B * T * C, p, seed, stream,
                  [](int64_t i) { return static_cast<uint64_t>(i); });
  EXPECT_EQ(gen, full);
}

TEST(Dropout, RejectsBadProbability) {
  float x = 1.0f;
  EXPECT_THROW(dropout_forward_btc(&x, nullptr, &x, 1, 1, 1, 1.0f, 0, 0, 0), ConfigError);
  EXPECT_THROW(dropout_forward_btc(&x, nullptr, &x, 1, 1, 1, -0.1f, 0, 0, 0), ConfigError);
}

TEST(Residual, ForwardAssignsBackwardAccumulates) {
  auto a = randn(33, 1), b = randn(33, 2), d = randn(33, 3);
  std::vector<float> out(33);
  residual_forward(out.data(), a.data(), b.data(), 33);
  for (int i = 0; i < 33; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  std::vector<float> d1(33, 1.0f), d2(33, 0.0f);
  residual_backward(d1.data(), d2.data(), d.data(), 33);
  for (int i = 0; i < 33; ++i) {
    EXPECT_EQ(d1[i], 1.0f + d[i]);
    EXPECT_EQ(d2[i], d[i]);
  }
}

}  // namespace
}  // namespace tessera::kernels
