// The precision of the GEMMs (docs/ARCHITECTURE.md, decision 33). Under Precision::BF16 a GEMM
// rounds both inputs to bf16 (round to nearest even) and accumulates the products in fp32 into an
// fp32 output; everything else (LayerNorm statistics, softmax, the fused attention's tiles, the
// loss, the MoE router, the optimizer) stays fp32. Two paths compute it:
//   OneDnn    oneDNN's bf16 matmul (bf16 copies of the inputs, fp32 destination); needs a CPU with
//             avx512_bf16 or amx_bf16 and a build with oneDNN (libdnnl-dev).
//   Emulated  OpenBLAS sgemm on bf16-rounded fp32 copies of the inputs. A product of two bf16
//             values is exact in fp32, so this is numerically a bf16 GEMM with fp32 accumulation
//             (up to the order of the sums); it runs at about fp32's speed (less the copies), on
//             any CPU.
// Auto takes the faster of the two, measured once per process: bf16 instructions are not always
// faster than fp32 ones (on Intel Sapphire/Emerald Rapids without AMX, vdpbf16ps issues at half
// the rate of fp32 FMAs, so oneDNN's bf16 matmul runs at 0.6x sgemm; on AMD Zen 4 it runs at 2x).
//
// The mode is per thread (ranks are threads): the model installs its own with GemmModeScope for
// the duration of its forward and backward, and every GEMM of the kernels reads
// current_gemm_mode().
#pragma once

#include <string>

namespace tessera::kernels {

enum class Precision { F32, BF16 };
// "fp32" | "bf16"; anything else is a ConfigError naming the accepted values. `what` names the
// setting in the message ("--precision").
Precision parse_precision(const std::string& s, const char* what = "--precision");
const char* to_string(Precision p);  // "fp32" | "bf16"

enum class Bf16Gemm { Auto, OneDnn, Emulated };
Bf16Gemm parse_bf16_gemm(const std::string& s);  // "auto" | "onednn" | "emulated"
const char* to_string(Bf16Gemm g);

// Whether this build has oneDNN, and whether its bf16 matmul can run on this CPU; when not, why
// not ("this build has no oneDNN (install libdnnl-dev and reconfigure)", "the CPU has neither
// avx512_bf16 nor amx_bf16 (it has: avx2 fma)").
bool onednn_built();
bool onednn_bf16_usable(std::string* why_not = nullptr);

// Auto -> Emulated when oneDNN is not usable, else the faster path as measured on this machine
// (measure_bf16_gemm_rates, ~30 ms, once per process; every later call gives the same answer).
// OneDnn when not usable is a ConfigError naming the missing feature.
Bf16Gemm resolve_bf16_gemm(Bf16Gemm requested);

// The rates Auto chooses by, in FLOP/s (measured now if Auto has not been resolved yet); all 0
// where oneDNN is not usable (nothing to choose).
struct Bf16GemmRates {
  double onednn = 0, emulated = 0;
  int n = 0;  // the n x n x n GEMM they were measured on
};
Bf16GemmRates auto_bf16_gemm_rates();

struct GemmMode {
  Precision precision = Precision::F32;
  Bf16Gemm bf16 = Bf16Gemm::Auto;  // resolved at the first bf16 GEMM when still Auto
  bool operator==(const GemmMode&) const = default;
};

// A sentence for start-up output: "fp32 GEMMs (OpenBLAS)", "bf16 GEMMs through oneDNN
// (avx512_bf16), fp32 accumulation", "bf16 GEMMs emulated (...)"; with why the path was taken
// when `requested` (the --bf16-gemm given) was Auto: the rates measured, or `chosen_by` when the
// caller chose the path otherwise (a resumed run keeps its checkpoint's path).
std::string describe(const GemmMode& m, Bf16Gemm requested, const std::string& chosen_by = "");
inline std::string describe(const GemmMode& m) {
  return describe(m, m.bf16);
}

// The calling thread's mode (default fp32).
const GemmMode& current_gemm_mode();

// Installs a mode on this thread until the scope ends (then the previous one again).
class GemmModeScope {
 public:
  explicit GemmModeScope(const GemmMode& mode);
  ~GemmModeScope();
  GemmModeScope(const GemmModeScope&) = delete;
  GemmModeScope& operator=(const GemmModeScope&) = delete;

 private:
  GemmMode previous_;
};

}  // namespace tessera::kernels
