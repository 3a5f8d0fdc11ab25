// What one core's bf16 units give against its fp32 units, in two layers:
//  1. instruction peak: 12 independent chains of fp32 FMAs (vfmadd231ps, 2 FLOP per lane) against
//     12 of bf16 dot products (vdpbf16ps: 2 products summed into each fp32 lane, 4 FLOP per lane),
//     on zmm registers where the CPU has AVX-512 (ymm for the FMAs otherwise);
//  2. GEMMs of n^3 on one thread: OpenBLAS sgemm (fp32), and the two bf16 paths that
//     --bf16-gemm auto chooses between (kernels/precision.h): oneDNN, and emulated.
// A bf16 speed-up over fp32 needs the bf16 instruction rate above the fp32 one (AMX aside): on
// AMD Zen 4 it is 2x; on an Intel Xeon (Emerald Rapids) without AMX it is 0.5x.
// Usage: bench_bf16_units [ROUNDS (5)]; the medians of ROUNDS alternating measurements.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/kernels/blas_setup.h"
#include "tessera/kernels/cpu_features.h"
#include "tessera/kernels/gemm_peak.h"
#include "tessera/kernels/precision.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr long kIterations = 20'000'000;  // x 12 instructions: ~0.05-0.2 s per measurement

#define TESSERA_REP12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define TESSERA_FMA_ZMM(i) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define TESSERA_FMA_YMM(i) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #i "\n"
#define TESSERA_DPBF16_ZMM(i) "vdpbf16ps %%zmm30, %%zmm31, %%zmm" #i "\n"

// FLOP/s of 12 independent chains of one instruction (the registers' contents do not matter for
// the rate): a function per instruction, as the instruction text must be a literal.
#define TESSERA_RATE_OF(name, op, flop_per_instruction)                                          \
  double name() {                                                                                \
    const auto t0 = Clock::now();                                                                \
    for (long n = 0; n < kIterations; ++n)                                                       \
      asm volatile(TESSERA_REP12(op)::                                                           \
                       : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", \
                         "xmm9", "xmm10", "xmm11");                                              \
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();                   \
    return 12.0 * kIterations * (flop_per_instruction) / s;                                      \
  }
TESSERA_RATE_OF(fma_zmm, TESSERA_FMA_ZMM, 32)        // 16 lanes x 2 FLOP
TESSERA_RATE_OF(fma_ymm, TESSERA_FMA_YMM, 16)        // 8 lanes x 2 FLOP
TESSERA_RATE_OF(dpbf16_zmm, TESSERA_DPBF16_ZMM, 64)  // 16 lanes x 2 products x 2 FLOP

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::kernels::use_fast_blas_kernels(argv);
  namespace k = tessera::kernels;
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const k::CpuFeatures& f = k::cpu_features();
  std::printf("CPU features: %s; %d rounds, medians\n", k::to_string(f).c_str(), rounds);
  openblas_set_num_threads(1);

  if (f.avx2 && f.fma) {
    std::vector<double> fp32, bf16;
    for (int r = 0; r < rounds; ++r) {
      fp32.push_back(f.avx512f ? fma_zmm() : fma_ymm());
      if (f.avx512_bf16) bf16.push_back(dpbf16_zmm());
    }
    std::printf("instruction peak, one core: fp32 FMA (%s) %.1f GFLOP/s", f.avx512f ? "zmm" : "ymm",
                median(fp32) / 1e9);
    if (f.avx512_bf16)
      std::printf(", bf16 vdpbf16ps (zmm) %.1f GFLOP/s: bf16 / fp32 = %.2f", median(bf16) / 1e9,
                  median(bf16) / median(fp32));
    std::printf("\n");
  }

  for (int n : {512, 1024}) {
    std::vector<double> fp32, onednn, emulated;
    for (int r = 0; r < rounds; ++r) {
      fp32.push_back(k::measure_gemm_peak(n, 2));  // fp32: the thread's default mode
      if (k::onednn_bf16_usable()) {
        const k::Bf16GemmRates b = k::measure_bf16_gemm_rates(n, 2);
        onednn.push_back(b.onednn);
        emulated.push_back(b.emulated);
      } else {
        const k::GemmModeScope bf16({k::Precision::BF16, k::Bf16Gemm::Emulated});
        emulated.push_back(k::measure_gemm_peak(n, 2));
      }
    }
    std::printf("GEMM %d^3, one thread: fp32 sgemm %.1f GFLOP/s", n, median(fp32) / 1e9);
    if (!onednn.empty())
      std::printf(", bf16 oneDNN %.1f (%.2fx fp32)", median(onednn) / 1e9,
                  median(onednn) / median(fp32));
    std::printf(", bf16 emulated %.1f (%.2fx fp32)\n", median(emulated) / 1e9,
                median(emulated) / median(fp32));
  }
  std::string why;
  if (!k::onednn_bf16_usable(&why))
    std::printf("oneDNN's bf16 matmul: not here (%s)\n", why.c_str());
  return 0;
}
