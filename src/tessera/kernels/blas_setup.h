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
// OPENBLAS_CORETYPE to SkylakeX (or Haswell) and re-executes the program with the same arguments.
// Does nothing when OPENBLAS_CORETYPE is already set (the user's or the machine's choice wins),
// when TESSERA_KEEP_BLAS_KERNELS=1, or when the re-execution fails.
void use_fast_blas_kernels(char** argv);

}  // namespace tessera::kernels
