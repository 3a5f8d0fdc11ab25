#include "tessera/kernels/precision.h"

#include <cblas.h>

#include <cstdio>

#include "tessera/core/error.h"
#include "tessera/kernels/cpu_features.h"
#include "tessera/kernels/gemm_peak.h"

namespace tessera::kernels {
namespace {

thread_local GemmMode current_mode;

// Auto's measurement, made at its first use (a function-local static: one thread measures, any
// other that asks meanwhile waits for it). On one thread: it compares what a core's bf16 and fp32
// units do. Two threads at n = 512 measure the libraries' threading instead (on a 2-core Xeon
// without AMX, oneDNN 145 against 106 GFLOP/s emulated, where training ran 0.86x as fast
// through oneDNN as emulated; one thread: 60 against 78). Callers resolve Auto before their
// ranks start GEMMs (the trainer, eval, sample), as the BLAS thread count is process-wide.
const Bf16GemmRates& auto_measurement() {
  static const Bf16GemmRates rates = [] {
    const int threads = openblas_get_num_threads();
    if (threads != 1) openblas_set_num_threads(1);
    const Bf16GemmRates r = measure_bf16_gemm_rates();
    if (threads != 1) openblas_set_num_threads(threads);
    return r;
  }();
  return rates;
}

Bf16Gemm faster_path(const Bf16GemmRates& r) {
  return r.onednn >= r.emulated ? Bf16Gemm::OneDnn : Bf16Gemm::Emulated;
}

std::string gflops(double flops) {
  char s[32];
  std::snprintf(s, sizeof s, "%.0f GFLOP/s", flops / 1e9);
  return s;
}

// "oneDNN 76 GFLOP/s against 121 GFLOP/s emulated on a 512^3 GEMM", the faster first.
std::string rates_sentence(const Bf16GemmRates& r) {
  const std::string onednn = "oneDNN " + gflops(r.onednn), emulated = gflops(r.emulated);
  const std::string shape = " on a " + std::to_string(r.n) + "^3 GEMM, one thread";
  if (faster_path(r) == Bf16Gemm::OneDnn)
    return onednn + " against " + emulated + " emulated" + shape;
  return emulated + " emulated against " + onednn + shape;
}

}  // namespace

Precision parse_precision(const std::string& s, const char* what) {
  if (s == "fp32") return Precision::F32;
  if (s == "bf16") return Precision::BF16;
  throw ConfigError(::tessera::detail::concat(what, " must be fp32 or bf16, got '", s, "'"));
}

const char* to_string(Precision p) {
  return p == Precision::BF16 ? "bf16" : "fp32";
}

Bf16Gemm parse_bf16_gemm(const std::string& s) {
  if (s == "auto") return Bf16Gemm::Auto;
  if (s == "onednn") return Bf16Gemm::OneDnn;
  if (s == "emulated") return Bf16Gemm::Emulated;
  throw ConfigError(
      ::tessera::detail::concat("--bf16-gemm must be auto, onednn or emulated, got '", s, "'"));
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
  if (requested == Bf16Gemm::Auto)
    return usable ? faster_path(auto_measurement()) : Bf16Gemm::Emulated;
  TESSERA_CHECK_AS(ConfigError, usable, "--bf16-gemm onednn: ", why,
                   "; use --bf16-gemm emulated (or auto) for the emulated bf16 path");
  return requested;
}

Bf16GemmRates auto_bf16_gemm_rates() {
  return onednn_bf16_usable() ? auto_measurement() : Bf16GemmRates{};
}

std::string describe(const GemmMode& m, Bf16Gemm requested, const std::string& chosen_by) {
  if (m.precision == Precision::F32) return "fp32 GEMMs (OpenBLAS)";
  const CpuFeatures& f = cpu_features();
  const char* unit = f.amx_bf16 ? "amx_bf16" : "avx512_bf16";
  std::string why;
  const bool usable = onednn_bf16_usable(&why);
  // Auto's reason: the measurement it was resolved by (made by now), unless the caller says.
  const bool measured = requested == Bf16Gemm::Auto && usable && chosen_by.empty();
  if (resolve_bf16_gemm(m.bf16) == Bf16Gemm::OneDnn)
    return std::string("bf16 GEMMs through oneDNN (") + unit + "), fp32 accumulation" +
           (!chosen_by.empty() ? "; " + chosen_by
            : measured         ? "; --bf16-gemm auto measured " + rates_sentence(auto_measurement())
                               : "");
  if (!chosen_by.empty())
    why = chosen_by;
  else if (usable)
    why = measured ? std::string("--bf16-gemm auto: faster here than oneDNN's ") + unit +
                         " matmul, " + rates_sentence(auto_measurement())
                   : "chosen with --bf16-gemm emulated";
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
