// GEMM rates measured on this machine, now.
//  - measure_gemm_peak: the rate this thread reaches in the precision it has installed
//    (kernels/precision.h), the "peak" that model FLOP utilisation (MFU) is measured against.
//  - measure_bf16_gemm_rates: the two bf16 GEMM paths side by side, which --bf16-gemm auto
//    chooses between (a CPU with bf16 instructions is not always faster with them: decision 33).
// Square n x n x n GEMMs, the best of `reps` after one warm-up, with the calling thread's BLAS /
// OpenMP threads.
#pragma once

#include "tessera/kernels/precision.h"

namespace tessera::kernels {

// FLOP/s (2 n^3 per GEMM). n = 1024 takes ~10-30 ms per GEMM on one core.
double measure_gemm_peak(int n = 1024, int reps = 3);

// FLOP/s of the same bf16 GEMM through oneDNN and through the emulated path (OpenBLAS sgemm on
// widened copies), timed alternately so that a change in the machine's load hits both. Inputs
// are bf16 bits, as a bf16 model's GEMMs mostly read them (records, weight copies). Needs
// onednn_bf16_usable(); ~30 ms at n = 512.
Bf16GemmRates measure_bf16_gemm_rates(int n = 512, int reps = 4);

}  // namespace tessera::kernels
