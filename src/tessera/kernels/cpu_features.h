// The CPU's bf16 capabilities, read at run time with cpuid and xgetbv (never from -march): the
// bf16 GEMM path is chosen from them (kernels/precision.h), so one binary runs everywhere.
#pragma once

#include <string>

namespace tessera::kernels {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;      // with the OS saving the ZMM and opmask registers
  bool avx512_bf16 = false;  // VDPBF16PS (Cooper Lake, Sapphire Rapids, Zen 4)
  bool amx_bf16 = false;     // AMX tiles with bf16 (Sapphire Rapids); OS support for tile state
  // A bf16 dot-product unit that oneDNN's bf16 matmul can use.
  bool has_bf16_compute() const { return avx512_bf16 || amx_bf16; }
};

// Detected once per process (immutable afterwards).
const CpuFeatures& cpu_features();

// "avx2 fma avx512f avx512_bf16" (the features above that are present), or "none".
std::string to_string(const CpuFeatures& f);

}  // namespace tessera::kernels
