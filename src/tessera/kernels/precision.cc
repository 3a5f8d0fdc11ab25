#include "tessera/kernels/precision.h"

#include "tessera/core/error.h"
#include "tessera/kernels/cpu_features.h"

namespace tessera::kernels {
namespace {

thread_local GemmMode current_mode;

}  // namespace

Precision parse_precision(const std::string& s, const char* what) {
  if (s == "fp32") return Precision::F32;
  if (s == "bf16") return Precision::BF16;
  throw ConfigError(detail::concat(what, " must be fp32 or bf16, got '", s, "'"));
}

const char* to_string(Precision p) {
  return p == Precision::BF16 ? "bf16" : "fp32";
}

Bf16Gemm parse_bf16_gemm(const std::string& s) {
  if (s == "auto") return Bf16Gemm::Auto;
  if (s == "onednn") return Bf16Gemm::OneDnn;
  if (s == "emulated") return Bf16Gemm::Emulated;
  throw ConfigError(detail::concat("--bf16-gemm must be auto, onednn or emulated, got '", s, "'"));
}

const char* to_string(Bf16Gemm g) {
  switch (g) {
    case Bf16Gemm::Auto:
      return "auto";
    case Bf16Gemm::OneDnn:
      return "onednn";
    case Bf16Gemm::Emulated:
      return "emulated";
  }
  return "?";
}

bool onednn_bf16_usable(std::string* why_not) {
  if (!onednn_built()) {
    if (why_not) *why_not = "this build has no oneDNN (install libdnnl-dev and reconfigure)";
    return false;
  }
  const CpuFeatures& f = cpu_features();
  if (!f.has_bf16_compute()) {
    if (why_not)
      *why_not = "the CPU has neither avx512_bf16 nor amx_bf16 (it has: " + to_string(f) + ")";
    return false;
  }
  return true;
}

Bf16Gemm resolve_bf16_gemm(Bf16Gemm requested) {
  if (requested == Bf16Gemm::Emulated) return requested;
  std::string why;
  const bool usable = onednn_bf16_usable(&why);
  if (requested == Bf16Gemm::Auto) return usable ? Bf16Gemm::OneDnn : Bf16Gemm::Emulated;
  TESSERA_CHECK_AS(ConfigError, usable, "--bf16-gemm onednn: ", why,
                   "; use --bf16-gemm emulated (or auto) for the emulated bf16 path");
  return requested;
}

std::string describe(const GemmMode& m) {
  if (m.precision == Precision::F32) return "fp32 GEMMs (OpenBLAS)";
  const CpuFeatures& f = cpu_features();
  if (resolve_bf16_gemm(m.bf16) == Bf16Gemm::OneDnn)
    return std::string("bf16 GEMMs through oneDNN (") + (f.amx_bf16 ? "amx_bf16" : "avx512_bf16") +
           "), fp32 accumulation";
  std::string why;
  if (onednn_bf16_usable(&why)) why = "chosen with --bf16-gemm emulated";
  return "bf16 GEMMs emulated (bf16-rounded inputs through OpenBLAS sgemm, fp32 accumulation; " +
         why + ")";
}

const GemmMode& current_gemm_mode() {
  return current_mode;
}

GemmModeScope::GemmModeScope(const GemmMode& mode) : previous_(current_mode) {
  current_mode = mode;
}

GemmModeScope::~GemmModeScope() {
  current_mode = previous_;
}

}  // namespace tessera::kernels
