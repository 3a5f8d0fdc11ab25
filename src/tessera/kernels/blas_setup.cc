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

namespace {

// The OPENBLAS_CORETYPE to set, or null.
const char* faster_blas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  const char* keep = std::getenv("TESSERA_KEEP_BLAS_KERNELS");
  if (keep != nullptr && std::strcmp(keep, "1") == 0) return nullptr;
  if (blas_core_name() != "Prescott") return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace

void use_fast_blas_kernels(char** argv) {
  const char* core = faster_blas_core();
  const bool spin =
      std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr;
  const bool blas_wait = std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr;
  if (core == nullptr && !spin && !blas_wait) return;
  if (core != nullptr) setenv("OPENBLAS_CORETYPE", core, 1);
  if (spin) setenv("GOMP_SPINCOUNT", kOpenMpSpinCount, 1);
  if (blas_wait) setenv("OPENBLAS_THREAD_TIMEOUT", kOpenBlasThreadTimeout, 1);
  execv("/proc/self/exe", argv);  // returns only on failure: keep running as loaded
  if (core != nullptr) unsetenv("OPENBLAS_CORETYPE");
  if (spin) unsetenv("GOMP_SPINCOUNT");
  if (blas_wait) unsetenv("OPENBLAS_THREAD_TIMEOUT");
}

}  // namespace tessera::kernels
