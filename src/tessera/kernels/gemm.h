// Dense layers through CBLAS (OpenBLAS). Weights are in Hugging Face Conv1D layout [in, out], so a
// layer is out = in . W (+ bias); the tied LM head uses the embedding [V, C] transposed.
// Row-major throughout; M = rows (tokens), K = input features, N = output features.
// Every GEMM below except sgemm runs in the calling thread's GEMM mode (kernels/precision.h): fp32,
// or bf16 inputs with fp32 accumulation; outputs and accumulated gradients are fp32 either way.
#pragma once

#include <cstdint>

#include "tessera/kernels/precision.h"

namespace tessera::kernels {

// Row-major C[M,N] = alpha * op(A) . op(B) + beta * C, with leading dimensions (thin CBLAS wrap).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// The same in the calling thread's GEMM mode: sgemm under fp32, gemm_bf16 under bf16.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// C[M,N] (fp32) = alpha * bf16(op(A)) . bf16(op(B)) + beta * C, products accumulated in fp32, where
// bf16() rounds to nearest even; A, B are not modified. path Auto resolves as resolve_bf16_gemm.
// Scratch: bf16 (or bf16-rounded fp32) copies of A and B, kept per thread and outside the
// allocator's accounting.
void gemm_bf16(Bf16Gemm path, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
// The same with A already in bf16 (A16: the bits of bf16 values, leading dimension lda): bitwise
// gemm_bf16 on A widened to fp32, without rounding A again (oneDNN reads it as it is; the
// emulated path widens it into its copy).
void gemm_bf16_a16(Bf16Gemm path, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                   const uint16_t* A16, int lda, const float* B, int ldb, float beta, float* C,
                   int ldc);

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
// matmul_backward's weight and bias gradients from an input kept in bf16 (in16[M,K]: bf16 bits):
//   dweight[K,N] += in^T . dout   (ACCUMULATES; null skips it)
//   dbias[N]     += column sums of dout (ACCUMULATES; null skips it)
// bf16 mode only (only a bf16 model keeps bf16 inputs); bitwise matmul_backward on the widened
// input.
void matmul_backward_weight_bf16(float* dweight, float* dbias, const float* dout,
                                 const uint16_t* in16, int M, int K, int N);

// Tied LM head: ASSIGNS out[M,N] = in[M,K] . weight[N,K]^T (weight is the [V, C] embedding).
void matmul_nt_forward(float* out, const float* in, const float* weight, int M, int K, int N);

// Backward of matmul_nt_forward: din[M,K] ASSIGNED = dout . weight (null skips it);
// dweight[N,K] += dout^T . in (ACCUMULATES; null skips it).
void matmul_nt_backward(float* din, float* dweight, const float* dout, const float* in,
                        const float* weight, int M, int K, int N);

}  // namespace tessera::kernels
