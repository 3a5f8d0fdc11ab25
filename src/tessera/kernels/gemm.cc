#include "tessera/kernels/gemm.h"

#include <cblas.h>

#include <cstring>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/kernels/bf16.h"

namespace tessera::kernels {

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS would still scale C; keep the same contract without calling it.
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[static_cast<int64_t>(i) * ldc + j] *= beta;
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, GemmInput A, int lda,
          GemmInput B, int ldb, float beta, float* C, int ldc) {
  const GemmMode& mode = current_gemm_mode();
  if (mode.precision == Precision::BF16) {
    gemm_bf16(mode.bf16, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  TESSERA_ASSERT(A.bf16 == nullptr && B.bf16 == nullptr,
                 "a bf16 GEMM input outside the bf16 GEMM mode");
  sgemm(trans_a, trans_b, M, N, K, alpha, A.f32, lda, B.f32, ldb, beta, C, ldc);
}

GemmInput output_gradient(const float* dout, int rows, int cols, int ld) {
  const GemmMode& mode = current_gemm_mode();
  if (mode.precision != Precision::BF16 || resolve_bf16_gemm(mode.bf16) != Bf16Gemm::OneDnn)
    return dout;
  thread_local std::vector<uint16_t> rounded;
  rounded.resize(static_cast<size_t>(rows) * static_cast<size_t>(cols));
  f32_to_bf16_rows(rounded.data(), dout, rows, cols, ld);
  return rounded.data();
}

namespace {

void add_column_sums(float* dbias, const float* dout, int M, int N) {
  for (int64_t i = 0; i < M; ++i) {
    const float* d = dout + i * N;
    for (int j = 0; j < N; ++j) dbias[j] += d[j];
  }
}

}  // namespace

void matmul_forward(float* out, GemmInput in, GemmInput weight, const float* bias,
                    const float* residual, int M, int K, int N) {
  // Seed the output with residual + bias and let the GEMM accumulate (beta = 1): one memory pass,
  // the same that BLAS would spend zeroing C for beta = 0.
  float beta = 0.0f;
  if (bias != nullptr || residual != nullptr) {
    beta = 1.0f;
    for (int64_t i = 0; i < M; ++i) {
      float* o = out + i * N;
      const float* r = residual ? residual + i * N : nullptr;
      if (r && bias) {
        for (int j = 0; j < N; ++j) o[j] = r[j] + bias[j];
      } else if (r) {
        if (r != o) std::memcpy(o, r, sizeof(float) * N);
      } else {
        std::memcpy(o, bias, sizeof(float) * N);
      }
    }
  }
  gemm(false, false, M, N, K, 1.0f, in, K, weight, N, beta, out, N);
}

void matmul_backward(float* din, float* dweight, float* dbias, const float* dout, GemmInput in,
                     GemmInput weight, int M, int K, int N, bool accumulate_din) {
  if (din != nullptr || dweight != nullptr) {
    const GemmInput d = output_gradient(dout, M, N, N);
    if (din != nullptr)
      gemm(false, true, M, K, N, 1.0f, d, N, weight, N, accumulate_din ? 1.0f : 0.0f, din, K);
    if (dweight != nullptr) gemm(true, false, K, N, M, 1.0f, in, K, d, N, 1.0f, dweight, N);
  }
  if (dbias != nullptr) add_column_sums(dbias, dout, M, N);
}

void matmul_nt_forward(float* out, GemmInput in, GemmInput weight, int M, int K, int N) {
  gemm(false, true, M, N, K, 1.0f, in, K, weight, K, 0.0f, out, N);
}

void matmul_nt_backward(float* din, float* dweight, const float* dout, GemmInput in,
                        GemmInput weight, int M, int K, int N) {
  if (din == nullptr && dweight == nullptr) return;
  const GemmInput d = output_gradient(dout, M, N, N);
  if (din != nullptr) gemm(false, false, M, K, N, 1.0f, d, N, weight, K, 0.0f, din, K);
  if (dweight != nullptr) gemm(true, false, N, K, M, 1.0f, d, N, in, K, 1.0f, dweight, K);
}

}  // namespace tessera::kernels
