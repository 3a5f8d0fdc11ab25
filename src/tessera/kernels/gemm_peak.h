// The GEMM rate this thread reaches in the precision it has installed (kernels/precision.h): the
// "peak" that model FLOP utilisation (MFU) is measured against. A square n x n x n GEMM through
// gemm(), the best of `reps` after one warm-up, with the calling thread's BLAS / OpenMP threads.
#pragma once

namespace tessera::kernels {

// FLOP/s (2 n^3 per GEMM). n = 1024 takes ~10-30 ms per GEMM on one core.
double measure_gemm_peak(int n = 1024, int reps = 3);

}  // namespace tessera::kernels
