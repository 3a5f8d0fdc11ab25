// The row kernels that spread over the rank's compute threads (parallel_rows): RMSNorm, LayerNorm,
// GELU, rotary embeddings, residual adds, softmax cross-entropy and its vocabulary-split pieces. On
// 2 and 3 threads each is bitwise what one thread computes, at sizes above parallel_rows' threshold
// (so that the threaded path runs), with accumulating outputs (+=) starting from non-zero values.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "compute_threads.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/kernels/parallel_rows.h"
#include "tessera/kernels/residual.h"
#include "tessera/kernels/rmsnorm.h"
#include "tessera/kernels/rope.h"
#include "tessera/kernels/softmax_xent.h"

namespace tessera::kernels {
namespace {

using tessera::testing::ComputeThreads;

std::vector<float> normal(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.5f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every output of every kernel, in one list, for a run on `threads` compute threads.
std::vector<std::vector<float>> run_kernels(int threads) {
  ComputeThreads scope(threads);
  std::vector<std::vector<float>> out;
  // RMSNorm: N x C above the threshold; its dweight pass splits the columns.
  const int64_t N = 1031, C = 1024;
  static_assert(1031 * 1024 >= kParallelRowsMinElements);
  const std::vector<float> x = normal(N * C, 1), w = normal(C, 2), dy = normal(N * C, 3);
  std::vector<float> y(N * C), rstd(N), dx = normal(N * C, 4), dw = normal(C, 5);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  out.insert(out.end(), {y, rstd, dx, dw});

  // Rotary embeddings, forward and inverse, with positions that repeat (as under context
  // parallelism a row's position is its own).
  const int heads = 16, hd = 64;
  std::vector<float> inv(hd / 2), cosv(64 * hd / 2), sinv(64 * hd / 2);
  rope_inverse_frequencies(inv.data(), hd, 10000.0);
  rope_tables(cosv.data(), sinv.data(), inv.data(), hd, 64);
  std::vector<int64_t> pos(N);
  for (int64_t r = 0; r < N; ++r) pos[r] = (r * 7) % 64;
  std::vector<float> q = normal(N * heads * hd, 6), dq = q;
  rope_apply(q.data(), N, heads, hd, heads * hd, pos.data(), cosv.data(), sinv.data());
  rope_apply(dq.data(), N, heads, hd, heads * hd, pos.data(), cosv.data(), sinv.data(), true);
  out.insert(out.end(), {q, dq});

  // Residual adds.
  const std::vector<float> a = normal(N * C, 7), b = normal(N * C, 8);
  std::vector<float> sum(N * C), biased(N * C), d1 = normal(N * C, 9), d2 = normal(N * C, 10);
  residual_forward(sum.data(), a.data(), b.data(), N * C);
  bias_residual_forward(biased.data(), a.data(), w.data(), b.data(), N, C);
  residual_backward(d1.data(), d2.data(), dy.data(), N * C);
  out.insert(out.end(), {sum, biased, d1, d2});

  // Cross-entropy over a vocabulary of V, with an ignored target, whole and as a slice.
  const int Nt = 300, V = 4000;
  const std::vector<float> logits = normal(static_cast<size_t>(Nt) * V, 11);
  std::vector<int32_t> targets(Nt);
  for (int n = 0; n < Nt; ++n) targets[n] = n == 17 ? -1 : (n * 131) % V;
  std::vector<float> losses(Nt), lse(Nt), dlogits(static_cast<size_t>(Nt) * V);
  const double total =
      softmax_xent_forward(losses.data(), lse.data(), logits.data(), targets.data(), Nt, V);
  softmax_xent_backward_slice(dlogits.data(), logits.data(), lse.data(), targets.data(), 0,
                              1.0f / Nt, Nt, V);
  std::vector<float> mx(Nt), sum_exp(Nt), target_logit(Nt);
  vocab_slice_max(mx.data(), logits.data(), Nt, V);
  vocab_slice_sum_exp(sum_exp.data(), target_logit.data(), logits.data(), mx.data(), targets.data(),
                      1000, Nt, V);
  out.insert(out.end(),
             {losses, lse, dlogits, mx, sum_exp, target_logit,
              std::vector<float>{static_cast<float>(total),
                                 static_cast<float>(total - static_cast<float>(total))}});

  // LayerNorm (its dweight and dbias pass splits the columns) and GELU, on odd sizes so that the
  // pieces start at any element.
  const std::vector<float> bias = normal(C, 12);
  std::vector<float> ln(N * C), mean(N), lrstd(N), ldx = normal(N * C, 13), ldw = normal(C, 14),
                                                   ldb = normal(C, 15);
  layernorm_forward(ln.data(), mean.data(), lrstd.data(), x.data(), w.data(), bias.data(), N, C,
                    1e-5f);
  layernorm_backward(ldx.data(), ldw.data(), ldb.data(), dy.data(), x.data(), w.data(), mean.data(),
                     lrstd.data(), N, C);
  const int64_t odd = N * C - 3;
  std::vector<float> g(odd), dg(odd);
  gelu_forward(g.data(), x.data(), odd);
  gelu_backward(dg.data(), dy.data(), x.data(), odd);
  out.insert(out.end(), {ln, mean, lrstd, ldx, ldw, ldb, g, dg});
  return out;
}

TEST(RowKernels, OnTwoAndThreeThreadsAreBitwiseOneThread) {
  const auto one = run_kernels(1);
  for (int threads : {2, 3}) {
    const auto many = run_kernels(threads);
    ASSERT_EQ(one.size(), many.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(bitwise_equal(one[i], many[i]))
          << "output " << i << ", " << threads << " threads";
  }
  // The outputs are the kernels' work, not untouched buffers: the forward rotation and its inverse
  // differ, and the residual sum is a + b.
  EXPECT_FALSE(bitwise_equal(one[4], one[5]));
  const std::vector<float> a = normal(1031 * 1024, 7), b = normal(1031 * 1024, 8);
  EXPECT_EQ(one[6][12345], a[12345] + b[12345]);
}

}  // namespace
}  // namespace tessera::kernels
