// oneDNN's bf16 matmul behind gemm_bf16 (internal to the kernels layer). Compiled from
// gemm_onednn.cc when CMake finds oneDNN (libdnnl-dev), else from gemm_onednn_absent.cc, whose
// onednn_built() is false and whose gemm_bf16_onednn is never reached (resolve_bf16_gemm refuses).
#pragma once

#include "tessera/kernels/gemm.h"

namespace tessera::kernels {

// C[M,N] (fp32) = alpha * bf16(op(A)) . bf16(op(B)) + beta * C with fp32 accumulation, M, N, K > 0.
// fp32 inputs are converted (round to nearest even) into per-thread bf16 buffers; bf16 inputs are
// read where they are when dense (leading dimension = row length), else copied. One matmul
// primitive per shape is created on first use and cached per thread.
void gemm_bf16_onednn(bool trans_a, bool trans_b, int M, int N, int K, float alpha, GemmInput A,
                      int lda, GemmInput B, int ldb, float beta, float* C, int ldc);

}  // namespace tessera::kernels
