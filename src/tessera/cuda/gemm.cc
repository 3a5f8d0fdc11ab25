#include "tessera/cuda/gemm.h"

#include <type_traits>

#include "tessera/core/error.h"
#include "tessera/cuda/runtime.h"

namespace tessera::cuda {

void check_cublas(cublasStatus_t s, std::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw Error(detail::concat("cublas: ", what, " failed: ", cublas_library().get_status_name(s)));
}

namespace {
// cuBLAS's recommended workspace on Hopper (32 MiB; 4 MiB suffices before it). Set explicitly so
// that it is allocated once, here, and not by cuBLAS inside the first GEMM of each stream.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
}  // namespace

Blas::Blas(cudaStream_t stream) : lib_(&cublas_library()), stream_(stream) {
  check_cublas(lib_->create(&h_), "cublasCreate");
  try {
    // The stream first: cublasSetStream resets the workspace to cuBLAS's own.
    check_cublas(lib_->set_stream(h_, stream_), "cublasSetStream");
    check(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc of cuBLAS's 32 MiB workspace");
    check_cublas(lib_->set_workspace(h_, workspace_, kWorkspaceBytes), "cublasSetWorkspace");
    // fp32 GEMMs stay fp32: no TF32 (CUBLAS_DEFAULT_MATH; NVIDIA_TF32_OVERRIDE=1 in the environment
    // would still force it, which tessera never sets).
    check_cublas(lib_->set_math_mode(h_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  } catch (...) {
    (void)lib_->destroy(h_);
    if (workspace_ != nullptr) (void)cudaFree(workspace_);
    throw;
  }
}

Blas::~Blas() {
  // Errors ignored: a destructor does not throw. The handle goes first (it may still reference
  // the workspace).
  if (h_ != nullptr) (void)lib_->destroy(h_);
  if (workspace_ != nullptr) (void)cudaFree(workspace_);
}

namespace {

template <typename T>
constexpr cudaDataType data_type() {
  if constexpr (std::is_same_v<T, float>)
    return CUDA_R_32F;
  else
    return CUDA_R_16BF;
}

template <typename TA, typename TC>
void check_types() {
  static_assert(std::is_same_v<TA, float> || std::is_same_v<TA, bf16>, "inputs are fp32 or bf16");
  static_assert(std::is_same_v<TC, float> || std::is_same_v<TC, bf16>, "outputs are fp32 or bf16");
  static_assert(!(std::is_same_v<TA, float> && std::is_same_v<TC, bf16>),
                "fp32 inputs take an fp32 output");
}

cublasOperation_t op(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// The problem in a call's error message: "row-major M=.. N=.. K=.. trans_a=.. ...".
std::string shape(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb, int ldc) {
  return detail::concat("(row-major M=", M, " N=", N, " K=", K, " trans_a=", trans_a ? 1 : 0,
                        " trans_b=", trans_b ? 1 : 0, " lda=", lda, " ldb=", ldb, " ldc=", ldc,
                        ")");
}

}  // namespace

// Row-major X with row stride ld is column-major X^T with leading dimension ld. So row-major
// C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T: cuBLAS gets B as its first
// operand and A as its second, m = N and n = M, with the same transpose flags (op(B)^T as cuBLAS
// sees it is op applied to the stored column-major B^T) and the same leading dimensions.
template <typename TA, typename TC>
void gemm(const Blas& blas, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const TA* A, int lda, const TA* B, int ldb, float beta, TC* C, int ldc) {
  check_types<TA, TC>();
  if (M == 0 || N == 0) return;
  // K == 0: cuBLAS scales C by beta (BLAS semantics), as kernels::sgemm does.
  check_cublas(
      blas.library().gemm_ex(blas.handle(), op(trans_b), op(trans_a), N, M, K, &alpha, B,
                             data_type<TA>(), ldb, A, data_type<TA>(), lda, &beta, C,
                             data_type<TC>(), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      detail::concat("cublasGemmEx ", shape(trans_a, trans_b, M, N, K, lda, ldb, ldc)));
}

template <typename TA, typename TC>
void gemm_batched(const Blas& blas, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const TA* A, int lda, int64_t stride_a, const TA* B, int ldb, int64_t stride_b,
                  float beta, TC* C, int ldc, int64_t stride_c, int batch) {
  check_types<TA, TC>();
  if (M == 0 || N == 0 || batch == 0) return;
  check_cublas(
      blas.library().gemm_strided_batched_ex(
          blas.handle(), op(trans_b), op(trans_a), N, M, K, &alpha, B, data_type<TA>(), ldb,
          static_cast<long long>(stride_b), A, data_type<TA>(), lda,
          static_cast<long long>(stride_a), &beta, C, data_type<TC>(), ldc,
          static_cast<long long>(stride_c), batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      detail::concat("cublasGemmStridedBatchedEx ", shape(trans_a, trans_b, M, N, K, lda, ldb, ldc),
                     " x ", batch));
}

#define TESSERA_CUDA_GEMM(TA, TC)                                                              \
  template void gemm<TA, TC>(const Blas&, bool, bool, int, int, int, float, const TA*, int,    \
                             const TA*, int, float, TC*, int);                                 \
  template void gemm_batched<TA, TC>(const Blas&, bool, bool, int, int, int, float, const TA*, \
                                     int, int64_t, const TA*, int, int64_t, float, TC*, int,   \
                                     int64_t, int);
TESSERA_CUDA_GEMM(float, float)
TESSERA_CUDA_GEMM(bf16, bf16)
TESSERA_CUDA_GEMM(bf16, float)
#undef TESSERA_CUDA_GEMM

}  // namespace tessera::cuda
