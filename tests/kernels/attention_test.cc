#include "tessera/kernels/attention.h"

#include "attention_reference.h"
#include "grad_check.h"
#include "tessera/core/error.h"
#include "tessera/core/philox.h"

namespace tessera::kernels {
namespace {

using testing::dot;
using testing::expect_fd_close;
using testing::randn;

// The float64 reference with the kernel's documented dropout mask.
std::vector<double> attention_ref(const std::vector<float>& qkv, int B, int T, int C, int NH,
                                  const AttentionDropout* drop) {
  if (drop == nullptr)
    return tessera::testing::causal_attention_ref(qkv, B, T, C, NH, 0, 0.0,
                                                  [](uint64_t) { return true; });
  return tessera::testing::causal_attention_ref(
      qkv, B, T, C, NH, drop->first_sample, drop->p,
      [&](uint64_t idx) { return philox_uniform(drop->seed, drop->stream, idx) > drop->p; });
}

struct Case {
  int B, T, C, NH;
  float p;
};

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, ForwardMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  const auto [B, T, C, NH, p] = GetParam();
  auto qkv = randn(static_cast<size_t>(B) * T * 3 * C, 11);
  auto dout = randn(static_cast<size_t>(B) * T * C, 12);
  AttentionDropout drop{p, 99, 1234, 5, 0, NH};
  const AttentionDropout* dp = p > 0 ? &drop : nullptr;
  std::vector<float> out(B * T * C), att(static_cast<size_t>(B) * NH * T * T),
      att_drop(p > 0 ? att.size() : 0);
  auto run = [&] {
    attention_forward(out.data(), att.data(), p > 0 ? att_drop.data() : nullptr, qkv.data(), B, T,
                      C, NH, dp);
  };
  run();
  const auto ref = attention_ref(qkv, B, T, C, NH, dp);
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(out[i], ref[i], 1e-5 * (1 + std::abs(ref[i])));
  std::vector<float> dqkv(qkv.size(), 123.0f), scratch(static_cast<size_t>(T) * T);
  attention_backward(dqkv.data(), scratch.data(), dout.data(), att.data(),
                     p > 0 ? att_drop.data() : nullptr, qkv.data(), B, T, C, NH, p);
  auto loss = [&] {
    run();
    return dot(out, dout);
  };
  expect_fd_close(qkv, dqkv, loss, "dqkv", 1e-2f, 1e-2, 3e-3);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(Case{1, 1, 4, 1, 0.0f}, Case{2, 5, 8, 2, 0.0f},
                                           Case{1, 64, 4, 2, 0.0f}, Case{2, 70, 8, 2, 0.0f},
                                           Case{1, 130, 4, 1, 0.0f}, Case{2, 9, 8, 2, 0.3f},
                                           Case{1, 70, 4, 1, 0.2f}));

TEST(Attention, RejectsHeadsNotDividingWidth) {
  std::vector<float> buf(3 * 10 * 3);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), nullptr, buf.data(), 1, 3, 10, 3),
               ShapeError);
}

}  // namespace
}  // namespace tessera::kernels

namespace tessera::kernels {
namespace {

// Grouped-query attention is multi-head attention whose key/value heads are repeated over their
// query heads (Hugging Face's repeat_kv): the same output, and each key/value head's gradient is
// the sum of its copies' gradients. Multi-query (kv = 1) and plain multi-head (kv = q) included.
TEST(Attention, GroupedQueryIsMultiHeadOverRepeatedKeyValueHeads) {
  const int B = 2, T = 70, hs = 4;  // T > one block of queries, so the block loop is covered
  for (const auto& [q, kv] : {std::pair{6, 2}, std::pair{4, 1}, std::pair{3, 3}}) {
    const AttentionHeads heads{q, kv, hs};
    const int G = q / kv, W = heads.row_width(), C = q * hs;
    const auto qkv = randn(static_cast<size_t>(B) * T * W, 21);
    const auto dout = randn(static_cast<size_t>(B) * T * C, 22);
    // The multi-head layout: key and value head h / G copied into head h's columns.
    std::vector<float> mha(static_cast<size_t>(B) * T * 3 * C);
    for (int64_t r = 0; r < int64_t{B} * T; ++r)
      for (int h = 0; h < q; ++h)
        for (int i = 0; i < hs; ++i) {
          const float* src = qkv.data() + r * W;
          float* dst = mha.data() + r * 3 * C;
          dst[h * hs + i] = src[h * hs + i];
          dst[C + h * hs + i] = src[C + (h / G) * hs + i];
          dst[2 * C + h * hs + i] = src[C + kv * hs + (h / G) * hs + i];
        }
    std::vector<float> out(B * T * C), att(static_cast<size_t>(B) * q * T * T);
    std::vector<float> out_ref(out.size()), att_ref(att.size()), scratch(T * T);
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), B, T, heads);
    attention_forward(out_ref.data(), att_ref.data(), nullptr, mha.data(), B, T, C, q);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], out_ref[i]) << q << "/" << kv;
    std::vector<float> dqkv(qkv.size()), dmha(mha.size());
    attention_backward(dqkv.data(), scratch.data(), dout.data(), att.data(), nullptr, qkv.data(), B,
                       T, heads);
    attention_backward(dmha.data(), scratch.data(), dout.data(), att_ref.data(), nullptr,
                       mha.data(), B, T, C, q);
    for (int64_t r = 0; r < int64_t{B} * T; ++r)
      for (int j = 0; j < kv; ++j)
        for (int i = 0; i < hs; ++i) {
          double dk = 0, dv = 0;
          for (int h = j * G; h < (j + 1) * G; ++h) {
            EXPECT_EQ(dqkv[r * W + h * hs + i], dmha[r * 3 * C + h * hs + i]);  // dq: per head
            dk += dmha[r * 3 * C + C + h * hs + i];
            dv += dmha[r * 3 * C + 2 * C + h * hs + i];
          }
          EXPECT_NEAR(dqkv[r * W + C + j * hs + i], dk, 1e-5 * (1 + std::abs(dk)));
          EXPECT_NEAR(dqkv[r * W + C + kv * hs + j * hs + i], dv, 1e-5 * (1 + std::abs(dv)));
        }
  }
}

TEST(Attention, RejectsKeyValueHeadsNotDividingQueryHeads) {
  std::vector<float> x(1000);
  EXPECT_THROW(
      attention_forward(x.data(), x.data(), nullptr, x.data(), 1, 2, AttentionHeads{6, 4, 2}),
      ShapeError);
}

}  // namespace
}  // namespace tessera::kernels

namespace tessera::kernels {
namespace {

// attention_decode against a float64 reference written from its contract: query i (position
// pos0 + i) of head h attends over keys [0, pos0 + i] of key/value head h / (q / kv). Rows with
// padding (ldq, ldkv wider than the heads) so that strides are honoured.
struct DecodeCase {
  int n;
  int64_t pos0;
  int q, kv, hs;
};

class AttentionDecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(AttentionDecodeTest, MatchesTheFloat64Reference) {
  const auto [n, pos0, q, kv, hs] = GetParam();
  const AttentionHeads heads{q, kv, hs};
  const int64_t L = pos0 + n, C = int64_t{q} * hs;
  const int64_t ldq = C + 3, ldkv = int64_t{kv} * hs + 5;
  const auto qs = randn(static_cast<size_t>(n * ldq), 31);
  const auto ks = randn(static_cast<size_t>(L * ldkv), 32);
  const auto vs = randn(static_cast<size_t>(L * ldkv), 33);
  std::vector<float> out(static_cast<size_t>(n * C), 123.0f);
  // The scratch the kernel asks for, then a guard it must not touch.
  const size_t used = static_cast<size_t>(attention_decode_scratch(n, pos0 + n, heads));
  std::vector<float> scratch(used + 64, -7.0f);
  attention_decode(out.data(), qs.data(), ldq, ks.data(), vs.data(), ldkv, n, pos0, heads,
                   scratch.data());
  for (size_t i = used; i < scratch.size(); ++i) ASSERT_EQ(scratch[i], -7.0f) << "scratch overrun";
  const int G = q / kv;
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < q; ++h) {
      const int64_t keys = pos0 + i + 1, g = h / G;
      std::vector<double> s(static_cast<size_t>(keys));
      double mx = -1e300, z = 0;
      for (int64_t j = 0; j < keys; ++j) {
        double d = 0;
        for (int e = 0; e < hs; ++e)
          d += static_cast<double>(qs[i * ldq + h * hs + e]) * ks[j * ldkv + g * hs + e];
        s[j] = d / std::sqrt(static_cast<double>(hs));
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) z += (x = std::exp(x - mx));
      for (int e = 0; e < hs; ++e) {
        double o = 0;
        for (int64_t j = 0; j < keys; ++j) o += s[j] / z * vs[j * ldkv + g * hs + e];
        ASSERT_NEAR(out[i * C + h * hs + e], o, 1e-5 * (1 + std::abs(o)))
            << "query " << i << " at position " << pos0 + i << ", head " << h;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionDecodeTest,
                         ::testing::Values(DecodeCase{1, 0, 1, 1, 4}, DecodeCase{1, 9, 6, 2, 4},
                                           DecodeCase{1, 9, 4, 1, 8}, DecodeCase{1, 100, 3, 3, 4},
                                           DecodeCase{5, 0, 4, 4, 4}, DecodeCase{5, 7, 6, 3, 4},
                                           DecodeCase{70, 3, 4, 2, 4}, DecodeCase{130, 0, 2, 1, 4},
                                           DecodeCase{3, 100, 4, 2, 4}));

// The n rows of a prefill at position 0 are attention_forward's rows of the whole sequence.
TEST(AttentionDecode, APrefillIsTheForwardsRows) {
  const int T = 70, q = 4, kv = 2, hs = 4;
  const AttentionHeads heads{q, kv, hs};
  const int W = heads.row_width(), C = q * hs;
  const auto qkv = randn(static_cast<size_t>(T) * W, 34);
  std::vector<float> want(static_cast<size_t>(T) * C), att(static_cast<size_t>(q) * T * T);
  attention_forward(want.data(), att.data(), nullptr, qkv.data(), 1, T, heads);
  std::vector<float> got(want.size()),
      scratch(static_cast<size_t>(attention_decode_scratch(T, T, heads)));
  attention_decode(got.data(), qkv.data(), W, qkv.data() + C, qkv.data() + C + kv * hs, W, T, 0,
                   heads, scratch.data());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << i;
}

TEST(AttentionDecode, RejectsEmptySteps) {
  std::vector<float> x(64);
  EXPECT_THROW(attention_decode(x.data(), x.data(), 8, x.data(), x.data(), 8, 0, 0,
                                AttentionHeads{2, 1, 4}, x.data()),
               ShapeError);
}

}  // namespace
}  // namespace tessera::kernels
