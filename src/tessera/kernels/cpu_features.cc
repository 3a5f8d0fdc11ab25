#include "tessera/kernels/cpu_features.h"

#include <cpuid.h>

#include <cstdint>

namespace tessera::kernels {
namespace {

struct Regs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  if (static_cast<uint32_t>(__get_cpuid_max(0, nullptr)) < leaf) return r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

// The register state the OS saves on a context switch (XCR0); 0 without OSXSAVE.
uint64_t os_saved_state() {
  if (!(cpuid(1, 0).ecx & (1u << 27))) return 0;  // OSXSAVE
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(uint32_t reg, int b) {
  return (reg >> b) & 1u;
}

CpuFeatures detect() {
  CpuFeatures f;
  const uint64_t xcr0 = os_saved_state();
  const bool ymm = (xcr0 & 0x6) == 0x6;            // SSE + AVX state
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;   // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  const Regs l1 = cpuid(1, 0), l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);
  f.fma = ymm && bit(l1.ecx, 12);
  f.avx2 = ymm && bit(l7.ebx, 5);
  f.avx512f = zmm && bit(l7.ebx, 16);
  f.avx512_bf16 = f.avx512f && bit(l7s1.eax, 5);
  f.amx_bf16 = tiles && bit(l7.edx, 22) && bit(l7.edx, 24);  // AMX-BF16 and AMX-TILE
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string to_string(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.avx512f, "avx512f");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_bf16, "amx_bf16");
  return s.empty() ? "none" : s;
}

}  // namespace tessera::kernels
