#include "model_loading.h"

#include <cstdio>

namespace tessera::app {

kernels::GemmMode gemm_mode_from_flags(const std::string& precision, const std::string& bf16_gemm) {
  const kernels::Bf16Gemm requested = kernels::parse_bf16_gemm(bf16_gemm);
  kernels::GemmMode m{kernels::parse_precision(precision), requested};
  if (m.precision == kernels::Precision::BF16) {
    m.bf16 = kernels::resolve_bf16_gemm(requested);
    std::fprintf(stderr, "precision: bf16, %s\n", kernels::describe(m, requested).c_str());
  }
  return m;
}

}  // namespace tessera::app
