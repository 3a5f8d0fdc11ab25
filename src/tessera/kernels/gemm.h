// Dense layers through CBLAS (OpenBLAS). Weights are in Hugging Face Conv1D layout [in, out], so a
// layer is out = in . W (+ bias); the tied LM head uses the embedding [V, C] transposed.
// Row-major throughout; M = rows (tokens), K = input features, N = output features.
#pragma once

#include <cstdint>

namespace tessera::kernels {

// Row-major C[M,N] = alpha * op(A) . op(B) + beta * C, with leading dimensions (thin CBLAS wrap).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// ASSIGNS out[M,N] = residual[M,N] + in[M,K] . weight[K,N] + bias[N].
// bias and residual may be null. residual may alias out (then it is an in-place +=).
void matmul_forward(float* out, const float* in, const float* weight, const float* bias,
                    const float* residual, int M, int K, int N);

// Backward of matmul_forward given dout[M,N]:
//   din[M,K]     = or += dout . weight^T  (ASSIGNS unless accumulate_din; null skips it)
//   dweight[K,N] += in^T . dout           (ACCUMULATES; null skips it)
//   dbias[N]     += column sums of dout   (ACCUMULATES; null skips it)
// The residual's gradient is dout itself; the caller keeps it.
void matmul_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                     const float* weight, int M, int K, int N, bool accumulate_din = false);

// Tied LM head: ASSIGNS out[M,N] = in[M,K] . weight[N,K]^T (weight is the [V, C] embedding).
void matmul_nt_forward(float* out, const float* in, const float* weight, int M, int K, int N);

// Backward of matmul_nt_forward: din[M,K] ASSIGNED = dout . weight (null skips it);
// dweight[N,K] += dout^T . in (ACCUMULATES; null skips it).
void matmul_nt_backward(float* din, float* dweight, const float* dout, const float* in,
                        const float* weight, int M, int K, int N);

}  // namespace tessera::kernels
