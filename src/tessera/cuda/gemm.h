// Dense products on the GPU through cuBLAS, in the CPU kernels' row-major terms (kernels/gemm.h):
// weights in Hugging Face Conv1D layout [in, out], so a layer is out = in . W. Row-major C[M, N]
// is column-major C^T, so each call hands cuBLAS the transposed problem C^T = op(B)^T op(A)^T with
// no copies.
//
// Two modes (the model's --precision):
//   F32   fp32 inputs, outputs and accumulation on the CUDA cores. TF32 stays off (cuBLAS's
//         default math mode; CUBLAS_COMPUTE_32F), so results match the CPU's fp32 to rounding.
//   BF16  bf16 inputs on the tensor cores, accumulated in fp32 (CUBLAS_COMPUTE_32F); the output
//         is bf16 (activations) or fp32 (weight gradients accumulated into the fp32 buffers).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>

#include "tessera/cuda/cublas_library.h"

namespace tessera::cuda {

using bf16 = __nv_bfloat16;

// Throws tessera::Error "cublas: <what> failed: <status name>" unless s == CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t s, std::string_view what);

// A cuBLAS handle bound to one stream (one per rank), with a workspace for cuBLAS's kernels. The
// first Blas of the process opens cuBLAS (cublas_library.h).
class Blas {
 public:
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t handle() const { return h_; }
  cudaStream_t stream() const { return stream_; }
  const CublasLibrary& library() const { return *lib_; }

 private:
  const CublasLibrary* lib_;
  cublasHandle_t h_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
};

// Row-major C[M, N] = alpha * op(A) . op(B) + beta * C, op(X) = X or X^T, with leading dimensions
// (elements between rows) lda, ldb, ldc, as kernels::sgemm. A and B are fp32 or both bf16
// (TA = TB); C is fp32 or, with bf16 inputs, bf16 or fp32. Instantiated for
// (float, float), (bf16, bf16) and (bf16, float).
template <typename TA, typename TC>
void gemm(const Blas& blas, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const TA* A, int lda, const TA* B, int ldb, float beta, TC* C, int ldc);

// `batch` independent products of the same shapes, matrix i at A + i * stride_a (elements) and
// likewise B and C: attention's per-(sample, head) products. Instantiated like gemm.
template <typename TA, typename TC>
void gemm_batched(const Blas& blas, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const TA* A, int lda, int64_t stride_a, const TA* B, int ldb, int64_t stride_b,
                  float beta, TC* C, int ldc, int64_t stride_c, int batch);

}  // namespace tessera::cuda
