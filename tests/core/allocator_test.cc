#include "tessera/core/allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tessera/core/tensor.h"

namespace tessera {
namespace {

TEST(Allocator, TracksInUseAndPeakPerCategory) {
  Allocator a("rank 3");
  {
    Tensor p = Tensor::empty({1000}, DType::F32, MemCategory::Parameters, "w", &a);
    Tensor g = Tensor::empty({500}, DType::F32, MemCategory::Gradients, "g", &a);
    EXPECT_EQ(a.in_use(), 6000u);
    EXPECT_EQ(a.in_use(MemCategory::Parameters), 4000u);
  }
  EXPECT_EQ(a.in_use(), 0u);
  EXPECT_EQ(a.peak(), 6000u);
  EXPECT_EQ(a.peak(MemCategory::Gradients), 2000u);
  a.reset_peaks();
  EXPECT_EQ(a.peak(), 0u);
}

TEST(Allocator, CapacityErrorNamesRankRequestAndHolders) {
  Allocator a("rank 1", 10000);
  Tensor big =
      Tensor::empty({2000}, DType::F32, MemCategory::Parameters, "h.0.mlp.c_fc.weight", &a);
  try {
    Tensor more = Tensor::empty({1000}, DType::F32, MemCategory::Activations, "attn.scores", &a);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("attn.scores"), std::string::npos) << m;
    EXPECT_NE(m.find("h.0.mlp.c_fc.weight"), std::string::npos) << m;
  }
  EXPECT_EQ(a.in_use(), 8000u);  // the failed request holds nothing
}

TEST(Allocator, CurrentScopeIsPerThreadAndNests) {
  Allocator a("a"), b("b");
  {
    CurrentAllocatorScope sa(a);
    EXPECT_EQ(&Allocator::current(), &a);
    {
      CurrentAllocatorScope sb(b);
      EXPECT_EQ(&Allocator::current(), &b);
    }
    EXPECT_EQ(&Allocator::current(), &a);
  }
  EXPECT_NE(&Allocator::current(), &a);
}

TEST(ParseBytes, UnitsAndErrors) {
  EXPECT_EQ(parse_bytes("2GiB"), 2ull << 30);
  EXPECT_EQ(parse_bytes("512 MiB"), 512ull << 20);
  EXPECT_EQ(parse_bytes("1.5GB"), 1500000000ull);
  EXPECT_EQ(parse_bytes("4096"), 4096ull);
  EXPECT_THROW(parse_bytes("lots"), ConfigError);
  EXPECT_THROW(parse_bytes("3 parsecs"), ConfigError);
}

// The VmFlags of the mapping that holds address p (/proc/self/smaps), or "" when none does.
std::string vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// A block of several huge pages asks the kernel for transparent huge pages (VmFlags "hg", set by
// madvise(MADV_HUGEPAGE)); a small one does not. Without THP in the kernel there is nothing to
// ask for, and TESSERA_HUGE_PAGES=0 turns the request off.
TEST(Allocator, LargeBlocksAskForHugePages) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (!std::getline(thp, modes) || modes.find("[never]") != std::string::npos)
    GTEST_SKIP() << "no transparent huge pages here";
  const char* env = std::getenv("TESSERA_HUGE_PAGES");
  if (env != nullptr && std::string(env) == "0") GTEST_SKIP() << "TESSERA_HUGE_PAGES=0";
  Allocator a("test");
  const size_t big = size_t{16} << 20;
  void* p = a.allocate(big, MemCategory::Other, "big");
  const std::string flags = vm_flags_at(static_cast<char*>(p) + big / 2);
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
  a.deallocate(p, big, MemCategory::Other, "big");
}

}  // namespace
}  // namespace tessera
