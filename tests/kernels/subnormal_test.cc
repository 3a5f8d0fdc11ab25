// The kernels on the vectorised exp (kernels/vec_math.h) compute on no subnormal number when
// neither their inputs nor their results need one. A subnormal operand costs a microcode assist
// per vector instruction on x86: GCC once folded exp_f's clamp into a constant arm that made
// SwiGLU's forward multiply every lane by 1 / (1 + e^88), a subnormal, and run 13x slower
// (docs/PERFORMANCE.md, "Subnormal constants"). x86's MXCSR register keeps sticky flags that say
// whether any instruction since they were cleared read a subnormal operand (DE) or rounded a
// result into the subnormal range (UE); these tests clear them, run a kernel on the calling thread
// and read them back.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "compute_threads.h"
#include "grad_check.h"
#include "tessera/kernels/flash_attention.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/softmax_xent.h"
#include "tessera/kernels/swiglu.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace tessera::kernels {
namespace {

using testing::randn;

#if defined(__x86_64__)
constexpr unsigned kDenormalOperand = 1u << 1, kUnderflow = 1u << 4;

// The subnormal flags the work raised. Sizes stay below parallel_rows' threshold, so every kernel
// runs on this thread, whose MXCSR this reads.
template <class Work>
unsigned subnormal_flags(Work&& work) {
  _mm_setcsr(_mm_getcsr() & ~0x3Fu);  // clear the six sticky exception flags
  work();
  return _mm_getcsr() & (kDenormalOperand | kUnderflow);
}

std::string describe(unsigned flags) {
  std::string s;
  if (flags & kDenormalOperand) s += "a subnormal operand (DE) ";
  if (flags & kUnderflow) s += "an underflow to a subnormal result (UE)";
  return s.empty() ? "none" : s;
}

// 64 tokens, gate and up side by side as the fused GEMM leaves them; values up to +-8.
TEST(Subnormals, SwigluComputesOnNone) {
  constexpr int64_t rows = 64, cols = 512, ld = 2 * cols;
  const auto gate_up = randn(rows * ld, 11, 3.0f);
  const auto dout = randn(rows * cols, 12, 1.0f);
  std::vector<float> out(rows * cols), grads(gate_up.size());
  const unsigned forward = subnormal_flags(
      [&] { swiglu_forward(out.data(), gate_up.data(), gate_up.data() + cols, rows, cols, ld); });
  EXPECT_EQ(forward, 0u) << "forward raised " << describe(forward);
  const unsigned backward = subnormal_flags([&] {
    swiglu_backward(grads.data(), grads.data() + cols, dout.data(), gate_up.data(),
                    gate_up.data() + cols, rows, cols, ld);
  });
  EXPECT_EQ(backward, 0u) << "backward raised " << describe(backward);
}

TEST(Subnormals, GeluComputesOnNone) {
  const auto in = randn(64 * 1024, 13, 3.0f);
  const auto dout = randn(in.size(), 14, 1.0f);
  std::vector<float> out(in.size()), din(in.size());
  const auto n = static_cast<int64_t>(in.size());
  const unsigned forward = subnormal_flags([&] { gelu_forward(out.data(), in.data(), n); });
  EXPECT_EQ(forward, 0u) << "forward raised " << describe(forward);
  const unsigned backward =
      subnormal_flags([&] { gelu_backward(din.data(), dout.data(), in.data(), n); });
  EXPECT_EQ(backward, 0u) << "backward raised " << describe(backward);
}

// Logits of unit scale over 1024 classes: every probability is far above the subnormal range.
TEST(Subnormals, SoftmaxCrossEntropyComputesOnNone) {
  constexpr int N = 32, V = 1024;
  const auto logits = randn(int64_t{N} * V, 15, 1.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = n * 31 % V;
  std::vector<float> losses(N), lse(N), dlogits(logits.size());
  const unsigned forward = subnormal_flags([&] {
    softmax_xent_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  });
  EXPECT_EQ(forward, 0u) << "forward raised " << describe(forward);
  const unsigned backward = subnormal_flags([&] {
    softmax_xent_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 1.0f / N, N,
                          V);
  });
  EXPECT_EQ(backward, 0u) << "backward raised " << describe(backward);
}

// Causal attention over 128 positions, 4 query heads over 2 key/value heads of 64, scores of unit
// scale. The fused kernel runs its tiles on the compute threads: one thread here.
TEST(Subnormals, FusedAttentionComputesOnNone) {
  tessera::testing::ComputeThreads one(1);
  constexpr int T = 128, NH = 4, KV = 2, hs = 64;
  constexpr int64_t ldq = NH * hs, ldkv = 2 * KV * hs;
  const auto q = randn(T * ldq, 16, 1.0f), kv = randn(T * ldkv, 17, 1.0f);
  const auto dout = randn(T * ldq, 18, 1.0f);
  FlashAttention a;
  a.B = 1, a.Tq = T, a.Tk = T;
  a.heads = AttentionHeads{NH, KV, hs};
  a.q = q.data(), a.ldq = ldq;
  a.k = kv.data(), a.v = kv.data() + KV * hs, a.ldkv = ldkv;
  std::vector<float> out(T * ldq), lse(NH * T), delta(NH * T), dq(q.size()), dkv(kv.size());
  const unsigned forward =
      subnormal_flags([&] { flash_attention_forward(a, out.data(), ldq, lse.data()); });
  EXPECT_EQ(forward, 0u) << "forward raised " << describe(forward);
  flash_attention_delta(delta.data(), out.data(), ldq, dout.data(), ldq, 1, T, a.heads);
  const unsigned backward = subnormal_flags([&] {
    flash_attention_backward(a, dout.data(), ldq, lse.data(), delta.data(), dq.data(), ldq,
                             dkv.data(), dkv.data() + KV * hs, ldkv);
  });
  EXPECT_EQ(backward, 0u) << "backward raised " << describe(backward);
}
#endif

}  // namespace
}  // namespace tessera::kernels
