// Dense layers through CBLAS (OpenBLAS). Weights are in Hugging Face Conv1D layout [in, out], so a
// layer is out = in . W (+ bias); the tied LM head uses the embedding [V, C] transposed.
// Row-major throughout; M = rows (tokens), K = input features, N = output features.
// Every GEMM below except sgemm runs in the calling thread's GEMM mode (kernels/precision.h): fp32,
// or bf16 inputs with fp32 accumulation; outputs and accumulated gradients are fp32 either way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/kernels/precision.h"

namespace tessera::kernels {

// A GEMM input: fp32 values, or the bits of the bf16 values a bf16 GEMM rounds them to (an
// activation a bf16 model keeps in bf16, a weight's bf16 copy). bf16 bits are read only in the
// bf16 GEMM mode; they give bitwise the GEMM of the fp32 values they round, without rounding
// again. Converts implicitly from either pointer (and from nullptr: no input).
struct GemmInput {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  GemmInput() = default;
  GemmInput(std::nullptr_t) {}               // NOLINT(google-explicit-constructor)
  GemmInput(const float* p) : f32(p) {}      // NOLINT(google-explicit-constructor)
  GemmInput(const uint16_t* p) : bf16(p) {}  // NOLINT(google-explicit-constructor)
};

// Row-major C[M,N] = alpha * op(A) . op(B) + beta * C, with leading dimensions (thin CBLAS wrap).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// The same in the calling thread's GEMM mode: sgemm under fp32 (bf16 inputs are refused there),
// gemm_bf16 under bf16.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, GemmInput A, int lda,
          GemmInput B, int ldb, float beta, float* C, int ldc);

// C[M,N] (fp32) = alpha * bf16(op(A)) . bf16(op(B)) + beta * C, products accumulated in fp32, where
// bf16() rounds fp32 inputs to nearest even (bf16 inputs are used as they are); A, B are not
// modified. path Auto resolves as resolve_bf16_gemm. Scratch: bf16 (or bf16-rounded fp32) copies
// of A and B, kept per thread and outside the allocator's accounting.
void gemm_bf16(Bf16Gemm path, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
               GemmInput A, int lda, GemmInput B, int ldb, float beta, float* C, int ldc);

// An output gradient dout[rows, cols] (row stride ld) as the two backward GEMMs that read it take
// it: through oneDNN, rounded once into per-thread scratch (bitwise what each GEMM would round;
// outside the allocator's accounting; valid until the thread's next call), dense; else dout as it
// is (the emulated path copies every input into fp32 scratch anyway, so pre-rounding would add a
// pass). Read it with leading dimension output_gradient_ld(...).
GemmInput output_gradient(const float* dout, int rows, int cols, int ld);
inline int output_gradient_ld(GemmInput g, int cols, int ld) {
  return g.bf16 ? cols : ld;
}

// ASSIGNS out[M,N] = residual[M,N] + in[M,K] . weight[K,N] + bias[N].
// bias and residual may be null. residual may alias out (then it is an in-place +=).
void matmul_forward(float* out, GemmInput in, GemmInput weight, const float* bias,
                    const float* residual, int M, int K, int N);

// Backward of matmul_forward given dout[M,N]:
//   din[M,K]     = or += dout . weight^T  (ASSIGNS unless accumulate_din; null skips it)
//   dweight[K,N] += in^T . dout           (ACCUMULATES; null skips it)
//   dbias[N]     += column sums of dout   (ACCUMULATES; null skips it)
// The residual's gradient is dout itself; the caller keeps it. Through oneDNN dout is rounded
// once for both GEMMs (bitwise what each would round).
void matmul_backward(float* din, float* dweight, float* dbias, const float* dout, GemmInput in,
                     GemmInput weight, int M, int K, int N, bool accumulate_din = false);

// Tied LM head: ASSIGNS out[M,N] = in[M,K] . weight[N,K]^T (weight is the [V, C] embedding).
void matmul_nt_forward(float* out, GemmInput in, GemmInput weight, int M, int K, int N);

// Backward of matmul_nt_forward: din[M,K] ASSIGNED = dout . weight (null skips it);
// dweight[N,K] += dout^T . in (ACCUMULATES; null skips it). dout is rounded once through oneDNN.
void matmul_nt_backward(float* din, float* dweight, const float* dout, GemmInput in,
                        GemmInput weight, int M, int K, int N);

}  // namespace tessera::kernels
