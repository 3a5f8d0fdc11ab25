// The bf16 GEMM (gemm.h): the path dispatch and the emulated path.
#include <vector>

#include "tessera/kernels/bf16.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/gemm_onednn.h"

namespace tessera::kernels {
namespace {

// Per-thread scratch for the rounded copies (ranks are threads; each keeps its own).
struct RoundedCopies {
  std::vector<float> a, b;
};
thread_local RoundedCopies rounded;

// A stored [rows, cols] with leading dimension ld, rounded into a dense buffer (ld = cols).
const float* rounded_copy(std::vector<float>& buf, const float* src, int rows, int cols, int ld) {
  buf.resize(static_cast<size_t>(rows) * cols);
  round_to_bf16_rows(buf.data(), src, rows, cols, ld);
  return buf.data();
}
// The same from bf16 bits: widened (exact), already rounded.
const float* rounded_copy(std::vector<float>& buf, const uint16_t* src, int rows, int cols,
                          int ld) {
  buf.resize(static_cast<size_t>(rows) * cols);
  bf16_to_f32_rows(buf.data(), src, rows, cols, ld);
  return buf.data();
}

// The emulated path: sgemm on bf16-rounded copies. Each product of two bf16 values has at most 16
// significant bits, so it is exact in fp32; the only rounding left is fp32 accumulation.
void gemm_bf16_emulated(bool trans_a, bool trans_b, int M, int N, int K, float alpha, GemmInput A,
                        int lda, GemmInput B, int ldb, float beta, float* C, int ldc) {
  // op(A) is [M, K]: A is stored [M, K], or [K, M] when transposed; likewise B.
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  auto copy = [](std::vector<float>& buf, GemmInput x, int rows, int cols, int ld) {
    return x.bf16 != nullptr ? rounded_copy(buf, x.bf16, rows, cols, ld)
                             : rounded_copy(buf, x.f32, rows, cols, ld);
  };
  const float* a = copy(rounded.a, A, a_rows, a_cols, lda);
  const float* b = copy(rounded.b, B, b_rows, b_cols, ldb);
  sgemm(trans_a, trans_b, M, N, K, alpha, a, a_cols, b, b_cols, beta, C, ldc);
}

}  // namespace

void gemm_bf16(Bf16Gemm path, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
               GemmInput A, int lda, GemmInput B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0 || K == 0) {  // nothing to round; sgemm keeps the beta contract (A unread)
    sgemm(trans_a, trans_b, M, N, K, alpha, nullptr, lda, nullptr, ldb, beta, C, ldc);
    return;
  }
  if (resolve_bf16_gemm(path) == Bf16Gemm::OneDnn)
    gemm_bf16_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    gemm_bf16_emulated(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace tessera::kernels
