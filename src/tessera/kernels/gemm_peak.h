// GEMM rates measured on this machine, now.
//  - measure_gemm_peak: the rate this thread reaches (wall clock, its BLAS threads) in the
//    precision it has installed (kernels/precision.h); benchmarks compare paths with it.
//  - measure_core_gemm_peak: one core's rate in CPU time, the "peak" per thread that model FLOP
//    utilisation (MFU) is measured against (train::choose_peak).
//  - measure_bf16_gemm_rates: the two bf16 GEMM paths side by side, which --bf16-gemm auto
//    chooses between (a CPU with bf16 instructions is not always faster with them: decision 33).
// Square n x n x n GEMMs, the best of `reps` after one warm-up, with the calling thread's BLAS /
// OpenMP threads.
#pragma once

#include "tessera/kernels/precision.h"

namespace tessera::kernels {

// FLOP/s (2 n^3 per GEMM). n = 1024 takes ~10-30 ms per GEMM on one core.
double measure_gemm_peak(int n = 1024, int reps = 3);

// What one core's GEMMs reach in the calling thread's precision: an n^3 GEMM on one BLAS thread
// (the process's BLAS thread count is set to 1 meanwhile and restored: call it before ranks
// start GEMMs), the best of `reps` after a warm-up, timed in the thread's CPU time, so that time
// the thread spent descheduled on a shared machine does not count. A rank computing on t threads
// cannot beat t times this (MFU's denominator: docs/PERFORMANCE.md, "MFU"). ~60 ms at n = 1024.
double measure_core_gemm_peak(int n = 1024, int reps = 5);

// FLOP/s of the same bf16 GEMM through oneDNN and through the emulated path (OpenBLAS sgemm on
// widened copies), timed alternately so that a change in the machine's load hits both. Inputs
// are bf16 bits, as a bf16 model's GEMMs mostly read them (records, weight copies). Needs
// onednn_bf16_usable(); ~30 ms at n = 512.
Bf16GemmRates measure_bf16_gemm_rates(int n = 512, int reps = 4);

}  // namespace tessera::kernels
