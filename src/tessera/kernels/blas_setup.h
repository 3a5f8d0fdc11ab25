// Choosing OpenBLAS's kernels. Debian 12's OpenBLAS 0.3.21 is built with DYNAMIC_ARCH and picks its
// kernels from the CPU model when the library loads. It does not know recent Intel models (the
// development machines report family 6 model 207) and falls back to its generic "Prescott" SSE3
// kernels, about 5x slower for sgemm on AVX-512 hardware. The variable OPENBLAS_CORETYPE overrides
// the choice, but OpenBLAS reads it before main() runs, so a program can only fix it by setting
// the variable and executing itself again. Programs call this first thing in main().
#pragma once

#include <string>

namespace tessera::kernels {

// The kernel family OpenBLAS chose ("SkylakeX", "Haswell", "Prescott", ...).
std::string blas_core_name();

// When OpenBLAS fell back to Prescott on a CPU that supports AVX-512 (or AVX2 + FMA), sets
// OPENBLAS_CORETYPE to SkylakeX (or Haswell); when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is
// set, sets GOMP_SPINCOUNT to kOpenMpSpinCount; when OPENBLAS_THREAD_TIMEOUT is not set, sets it to
// kOpenBlasThreadTimeout; if it set any, re-executes the program with the same arguments (the
// libraries read them before main() runs). OPENBLAS_CORETYPE is left alone when already set or
// when TESSERA_KEEP_BLAS_KERNELS=1; the spin count when either OpenMP variable is set; the
// timeout when it is set. Nothing changes when the re-execution fails.
void use_fast_blas_kernels(char** argv);

// How long an idle OpenMP thread (oneDNN's bf16 GEMMs run on libgomp's threads) spins before it
// sleeps. libgomp's default, 300000 spins (about a millisecond), keeps a waiting thread on its core
// through the rank's serial work between two GEMMs; on a machine shared with other work (or with
// OpenBLAS's and parallel_rows' threads) those spinning threads take the cores the work needs:
// docs/PERFORMANCE.md, "OpenMP's spinning threads".
inline constexpr const char* kOpenMpSpinCount = "10000";

// How long an idle OpenBLAS thread polls for work before it sleeps: 2^10 cycles (under a
// microsecond) instead of OpenBLAS's 2^28 (about 0.1 s). Between two GEMMs the rank's own work
// runs (norms, attention, the optimizer), threaded by parallel_rows on the same cores; a BLAS
// thread that polls (with sched_yield) takes half of a core from it. Llama 100M, 2 threads: 448 ->
// 458 tokens/s; any value from 2^4 to 2^18 measured the same (docs/PERFORMANCE.md, "OpenBLAS's
// polling threads").
inline constexpr const char* kOpenBlasThreadTimeout = "10";

}  // namespace tessera::kernels
