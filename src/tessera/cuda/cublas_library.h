// cuBLAS, opened on first use instead of linked. Linked, libcublas and libcublasLt (541 MB) were
// mapped at the start of every process that links tessera_train, GPU or not: `tessera --version`
// took 0.14-0.15 s and 230 MB of RSS, of which a bare main linked with -lcublas accounts for 0.07 s
// and 219 MB, over ~1300 test processes and every scripted `tessera` call (docs/PERFORMANCE.md,
// "cuBLAS opened on first use"). So the first Blas (gemm.h) opens the library and looks up the few
// functions tessera calls; a process that never uses a GPU never maps it.
#pragma once

#include <cublas_v2.h>

#include <string>
#include <vector>

namespace tessera::cuda {

// cublas_api.h overloads these two in C++ (inline wrappers that take the compute type as a
// cudaDataType), so `decltype(&cublasGemmEx)` is ambiguous: the exported signature is spelled
// here, and the (unevaluated) cast compiles only if it is exactly one of the header's.
using CublasGemmExFn =
    decltype(static_cast<cublasStatus_t (*)(
                 cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                 const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                 cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t)>(&cublasGemmEx));
using CublasGemmStridedBatchedExFn =
    decltype(static_cast<cublasStatus_t (*)(
                 cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                 const void*, cudaDataType, int, long long, const void*, cudaDataType, int,
                 long long, const void*, void*, cudaDataType, int, long long, int,
                 cublasComputeType_t, cublasGemmAlgo_t)>(&cublasGemmStridedBatchedEx));

// The cuBLAS functions tessera calls, typed from cublas_v2.h's declarations (cublasCreate and the
// others it maps to their _v2 symbols). Every member is non-null.
struct CublasLibrary {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasSetWorkspace) set_workspace;
  decltype(&cublasSetMathMode) set_math_mode;
  CublasGemmExFn gemm_ex;
  CublasGemmStridedBatchedExFn gemm_strided_batched_ex;
  decltype(&cublasGetStatusName) get_status_name;
};

// The library, opened on the first call (thread-safe; later calls return the same table, and the
// library stays open until the process exits). Tries the toolkit's soname ("libcublas.so.13")
// through the loader's search (LD_LIBRARY_PATH, the executable's RUNPATH, ld.so.cache), then the
// copy the build linked against, by full path. Throws tessera::Error naming the files tried and
// the loader's messages when none opens or a function is missing; a later call tries again.
const CublasLibrary& cublas_library();

// Opens the first of `files` (sonames or paths) that loads and looks the functions up in it, as
// cublas_library() does with its two; each call opens the library again (tests: the errors).
CublasLibrary load_cublas(const std::vector<std::string>& files);

}  // namespace tessera::cuda
