// bf16 conversion, CPU feature detection and the precision settings.
#include "tessera/kernels/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/error.h"
#include "tessera/kernels/cpu_features.h"
#include "tessera/kernels/precision.h"

namespace tessera::kernels {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent reference: the two bf16 neighbours of a finite x, the nearer chosen in double
// arithmetic, ties to the one with an even last bit; beyond the largest bf16 (halfway to 2^128
// and more) infinity.
float reference_round(float x) {
  const uint32_t down = bits(x) & 0xffff0000u;
  const float lo = from_bits(down);
  const float hi = from_bits(down + 0x10000u);  // next bf16 away from zero (may be infinity)
  const double dlo = std::fabs(static_cast<double>(x) - lo);
  const double max_bf16 = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127
  if (std::isinf(hi)) {
    const double halfway = max_bf16 + std::ldexp(1.0, 119);
    return std::fabs(static_cast<double>(x)) >= halfway ? hi : lo;
  }
  const double dhi = std::fabs(static_cast<double>(hi) - x);
  if (dlo != dhi) return dlo < dhi ? lo : hi;
  return (down >> 16) & 1u ? hi : lo;
}

float round_one(float x) {
  float y;
  round_to_bf16(&y, &x, 1);
  return y;
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(round_one(1.0f + std::ldexp(1.0f, -8)), 1.0f);  // halfway, 1.0 is even
  EXPECT_EQ(round_one(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));  // to even
  EXPECT_EQ(round_one(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)),
            1.0f + std::ldexp(1.0f, -7));  // above halfway
  EXPECT_EQ(round_one(-1.0f - std::ldexp(1.0f, -8)), -1.0f);
  EXPECT_EQ(round_one(3.140625f), 3.140625f);  // already a bf16
  EXPECT_EQ(bits(round_one(-0.0f)), bits(-0.0f));
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_one(inf), inf);
  EXPECT_EQ(round_one(-inf), -inf);
  EXPECT_EQ(round_one(std::numeric_limits<float>::max()), inf);          // past the largest bf16
  EXPECT_EQ(round_one(from_bits(0x7f7f7fffu)), from_bits(0x7f7f0000u));  // largest bf16 kept
  // Every NaN, including payloads only in the low half that plain rounding would carry into an
  // infinity, stays a NaN.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff80ffffu, 0x7fffffffu, 0x7f80ffffu}) {
    EXPECT_TRUE(std::isnan(round_one(from_bits(nan)))) << std::hex << nan;
    uint16_t b = 0;
    const float x = from_bits(nan);
    f32_to_bf16(&b, &x, 1);
    EXPECT_EQ(b & 0x7f80u, 0x7f80u);
    EXPECT_NE(b & 0x7fu, 0u) << std::hex << nan;
  }
  // Subnormals are kept, not flushed.
  const float tiny = std::ldexp(1.0f, -130);  // a bf16 subnormal (smallest: 2^-133)
  EXPECT_EQ(round_one(tiny), tiny);
  EXPECT_EQ(round_one(std::ldexp(1.0f, -133) * 1.75f), std::ldexp(1.0f, -132));
  EXPECT_EQ(round_one(std::numeric_limits<float>::denorm_min()), 0.0f);  // rounds to zero (even)
}

TEST(Bf16, MatchesIndependentReferenceAndScalarConversionOnRandomBits) {
  std::mt19937 rng(7);
  std::vector<float> x(1 << 16);
  for (float& v : x) {
    do v = from_bits(static_cast<uint32_t>(rng()));
    while (std::isnan(v));
  }
  std::vector<float> r(x.size()), back(x.size());
  std::vector<uint16_t> b(x.size());
  round_to_bf16(r.data(), x.data(), static_cast<int64_t>(x.size()));
  f32_to_bf16(b.data(), x.data(), static_cast<int64_t>(x.size()));
  bf16_to_f32(back.data(), b.data(), static_cast<int64_t>(b.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(bits(r[i]), bits(reference_round(x[i]))) << "x = " << x[i];
    ASSERT_EQ(bits(back[i]), bits(r[i]));
    ASSERT_EQ(b[i], to_bf16(x[i]).bits);  // the kernel and core/dtype.h agree
  }
}

TEST(Bf16, RowsHonourTheLeadingDimension) {
  const std::vector<float> in = {1.00390625f, 2, 99, 3, 4, 99};  // [2, 2] with ld 3
  std::vector<float> out(4, -1);
  round_to_bf16_rows(out.data(), in.data(), 2, 2, 3);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4}));
  std::vector<uint16_t> b(4);
  f32_to_bf16_rows(b.data(), in.data(), 2, 2, 3);
  EXPECT_EQ(b[3], to_bf16(4.0f).bits);
}

// The kernel's view of /proc/cpuinfo (which reflects what the OS enables) must match cpuid's.
TEST(CpuFeatures, AgreeWithProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags on this system";
  auto has = [&](const char* f) {
    return flags.find(std::string(" ") + f + " ") != std::string::npos;
  };
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(f.amx_bf16, has("amx_bf16") && has("amx_tile"));
  RecordProperty("cpu_features", to_string(f));
}

TEST(Precision, ParsesAndRejectsWithTheAcceptedValues) {
  EXPECT_EQ(parse_precision("fp32"), Precision::F32);
  EXPECT_EQ(parse_precision("bf16"), Precision::BF16);
  EXPECT_STREQ(to_string(Precision::BF16), "bf16");
  try {
    parse_precision("fp16");
    FAIL() << "fp16 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--precision must be fp32 or bf16, got 'fp16'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(parse_bf16_gemm("emulated"), Bf16Gemm::Emulated);
  EXPECT_THROW(parse_bf16_gemm("amx"), ConfigError);
}

TEST(Precision, ResolvesThePathFromTheCpuAndTheBuild) {
  std::string why;
  const bool usable = onednn_bf16_usable(&why);
  EXPECT_EQ(usable, onednn_built() && cpu_features().has_bf16_compute());
  EXPECT_EQ(usable, why.empty()) << why;
  EXPECT_EQ(resolve_bf16_gemm(Bf16Gemm::Emulated), Bf16Gemm::Emulated);
  if (usable) {
    EXPECT_EQ(resolve_bf16_gemm(Bf16Gemm::OneDnn), Bf16Gemm::OneDnn);
  } else {
    EXPECT_THROW(resolve_bf16_gemm(Bf16Gemm::OneDnn), ConfigError);
    EXPECT_EQ(resolve_bf16_gemm(Bf16Gemm::Auto), Bf16Gemm::Emulated);
    EXPECT_EQ(auto_bf16_gemm_rates().n, 0);  // nothing to choose between
  }
  EXPECT_NE(describe({Precision::BF16, Bf16Gemm::Emulated}).find("emulated"), std::string::npos);
  EXPECT_EQ(describe({}), "fp32 GEMMs (OpenBLAS)");
}

// Where both paths run, auto takes the one measured faster, once per process: every call gives the
// same answer, and the start-up sentence gives the rates it chose by.
TEST(Precision, AutoTakesTheFasterPathMeasuredOnce) {
  if (!onednn_bf16_usable()) GTEST_SKIP() << "oneDNN's bf16 matmul does not run here";
  const Bf16GemmRates r = auto_bf16_gemm_rates();
  EXPECT_EQ(r.n, 512);
  EXPECT_GT(r.onednn, 1e8);  // FLOP/s: any CPU with bf16 units does far more
  EXPECT_GT(r.emulated, 1e8);
  const Bf16Gemm chosen = resolve_bf16_gemm(Bf16Gemm::Auto);
  EXPECT_EQ(chosen, r.onednn >= r.emulated ? Bf16Gemm::OneDnn : Bf16Gemm::Emulated);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resolve_bf16_gemm(Bf16Gemm::Auto), chosen);
  const Bf16GemmRates again = auto_bf16_gemm_rates();
  EXPECT_EQ(again.onednn, r.onednn);  // not measured again
  EXPECT_EQ(again.emulated, r.emulated);

  const std::string said = describe({Precision::BF16, chosen}, Bf16Gemm::Auto);
  EXPECT_NE(said.find("--bf16-gemm auto"), std::string::npos) << said;
  EXPECT_NE(said.find("GFLOP/s"), std::string::npos) << said;
  EXPECT_NE(said.find(chosen == Bf16Gemm::OneDnn ? "through oneDNN" : "emulated"),
            std::string::npos)
      << said;
  // An explicit choice says so; a caller's own reason replaces the rates.
  EXPECT_NE(
      describe({Precision::BF16, Bf16Gemm::Emulated}).find("chosen with --bf16-gemm emulated"),
      std::string::npos);
  const std::string kept = describe({Precision::BF16, Bf16Gemm::Emulated}, Bf16Gemm::Auto,
                                    "the path of the run resumed");
  EXPECT_NE(kept.find("the path of the run resumed"), std::string::npos) << kept;
  EXPECT_EQ(kept.find("GFLOP/s"), std::string::npos) << kept;
}

TEST(Precision, ModeIsPerThreadAndScoped) {
  const GemmMode bf16{Precision::BF16, Bf16Gemm::Emulated};
  EXPECT_EQ(current_gemm_mode(), GemmMode{});
  {
    GemmModeScope scope(bf16);
    EXPECT_EQ(current_gemm_mode(), bf16);
    GemmMode seen_elsewhere{Precision::BF16, Bf16Gemm::OneDnn};
    std::thread([&] { seen_elsewhere = current_gemm_mode(); }).join();
    EXPECT_EQ(seen_elsewhere, GemmMode{});  // another rank thread keeps its own
    {
      GemmModeScope inner(GemmMode{});
      EXPECT_EQ(current_gemm_mode(), GemmMode{});
    }
    EXPECT_EQ(current_gemm_mode(), bf16);
  }
  EXPECT_EQ(current_gemm_mode(), GemmMode{});
}

}  // namespace
}  // namespace tessera::kernels
