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
