#include "tessera/kernels/blas_setup.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

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
  // The variables to set (name, value) before the libraries load again.
  std::vector<std::pair<const char*, const char*>> set;
  if (const char* core = faster_blas_core()) set.emplace_back("OPENBLAS_CORETYPE", core);
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
    set.emplace_back("GOMP_SPINCOUNT", kOpenMpSpinCount);
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr)
    set.emplace_back("OPENBLAS_THREAD_TIMEOUT", kOpenBlasThreadTimeout);
  if (set.empty()) return;
  for (const auto& [name, value] : set) setenv(name, value, 1);
  execv("/proc/self/exe", argv);  // returns only on failure: keep running as loaded
  for (const auto& [name, value] : set) unsetenv(name);
}

}  // namespace tessera::kernels
