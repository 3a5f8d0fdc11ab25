#include "tessera/kernels/blas_setup.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace tessera::kernels {

std::string blas_core_name() {
  const char* n = openblas_get_corename();
  return n ? n : "unknown";
}

void use_fast_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* keep = std::getenv("TESSERA_KEEP_BLAS_KERNELS");
  if (keep != nullptr && std::strcmp(keep, "1") == 0) return;
  if (blas_core_name() != "Prescott") return;
  const char* core = nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    core = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    core = "Haswell";
  if (core == nullptr) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv("/proc/self/exe", argv);  // returns only on failure: keep running on the slow kernels
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace tessera::kernels
