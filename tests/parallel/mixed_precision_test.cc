// --precision bf16 (decision 31): every layout family trains the model one bf16 rank trains, within
// 1e-3 relative loss per step (bf16 rounds each GEMM input; layouts only change the order of the
// fp32 sums, and an fp32 difference of 1 ulp can move a rounded input by one bf16 ulp, so equality
// is not bitwise); bf16 stays near fp32; checkpoints hold the fp32 masters and resume in either
// precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "run_compare.h"
#include "tessera/io/safetensors.h"
#include "tessera/kernels/precision.h"
#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

using testing::temp_dir;

TrainConfig bf16_config(const std::filesystem::path& dir, bool moe = false) {
  TrainConfig c = testing::tiny_config(dir);
  c.heads = 4;
  c.batch = 4;
  c.micro_batch = 1;  // one sequence per micro-batch in every layout
  c.steps = 5;
  c.lr = 5e-3f;
  c.dropout = 0.1f;
  c.grad_clip = 0.5f;
  c.bucket_mb = 0.01;
  c.val_fraction = 0;
  c.precision = "bf16";
  if (moe) {
    c.moe_experts = 4;
    c.moe_capacity_factor = 0.75f;
    c.moe_aux_loss = 0.05f;
    c.moe_z_loss = 0.01f;
  }
  return c;
}

// Largest |got - ref| / |ref| over the steps.
double max_rel_loss_diff(const std::vector<double>& ref, const std::vector<double>& got) {
  EXPECT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i)
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / std::fabs(ref[i]));
  return worst;
}

const std::vector<double>& one_rank(bool moe) {
  static std::map<bool, std::vector<double>> refs;
  auto it = refs.find(moe);
  if (it == refs.end()) {
    auto dir = temp_dir(moe ? "bf16_reference_moe" : "bf16_reference");
    it = refs.emplace(moe, run_training(bf16_config(dir, moe), nullptr).losses).first;
  }
  return it->second;
}

struct Layout {
  std::string name;
  int dp = 1, zero = 0, tp = 1, pp = 1, ep = 1;
  bool sp = false, moe = false;
  std::string schedule = "1f1b";
};

class Bf16Layouts : public ::testing::TestWithParam<Layout> {};

TEST_P(Bf16Layouts, TrainLikeOneBf16Rank) {
  const Layout& l = GetParam();
  auto dir = temp_dir("bf16_" + l.name);
  TrainConfig c = bf16_config(dir, l.moe);
  c.dp = l.dp, c.zero = l.zero, c.tp = l.tp, c.sp = l.sp, c.pp = l.pp, c.ep = l.ep;
  c.schedule = l.schedule;
  const std::vector<double> got = run_training(c, nullptr).losses;
  const double worst = max_rel_loss_diff(one_rank(l.moe), got);
  EXPECT_LE(worst, 1e-3) << l.name;
  RecordProperty("max_rel_loss_diff", std::to_string(worst));
  std::printf("[ bf16 %-10s ] max relative loss difference to one bf16 rank: %.2e\n",
              l.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16Layouts,
                         ::testing::Values(Layout{"dp2_zero0", 2, 0}, Layout{"dp2_zero1", 2, 1},
                                           Layout{"dp2_zero3", 2, 3}, Layout{"tp2", 1, 0, 2},
                                           Layout{"tp2_sp", 1, 0, 2, 1, 1, true},
                                           Layout{"pp2_1f1b", 1, 0, 1, 2},
                                           Layout{"pp2_zbh1", 1, 0, 1, 2, 1, false, false, "zb-h1"},
                                           Layout{"moe_dp2_ep2", 2, 0, 1, 1, 2, false, true}),
                         [](const auto& info) { return info.param.name; });

// bf16 really changes the numbers (a mode that were ignored would pass every test above), and stays
// close to fp32; both bf16 paths train the same model up to the order of their fp32 sums.
TEST(Bf16Training, DiffersFromFp32ByLittleAndPathsAgree) {
  auto dir = temp_dir("bf16_vs_fp32");
  TrainConfig c = bf16_config(dir);
  c.precision = "fp32";
  const std::vector<double> fp32 = run_training(c, nullptr).losses;
  const std::vector<double>& bf16 = one_rank(false);
  const double d = max_rel_loss_diff(fp32, bf16);
  EXPECT_GT(d, 1e-6) << "bf16 gave fp32's losses: the precision was not applied";
  EXPECT_LT(d, 2e-2);
  std::printf("[ bf16 vs fp32 ] max relative loss difference: %.2e\n", d);

  c.precision = "bf16";
  c.bf16_gemm = "emulated";
  const std::vector<double> emulated = run_training(c, nullptr).losses;
  const double p = max_rel_loss_diff(bf16, emulated);
  EXPECT_LE(p, 1e-3);
  std::printf("[ bf16 emulated vs %s ] max relative loss difference: %.2e\n",
              kernels::to_string(kernels::resolve_bf16_gemm(kernels::Bf16Gemm::Auto)), p);
}

// A bf16 run's checkpoint holds fp32 master weights and optimizer state: it resumes bitwise in
// bf16, and in fp32 it continues from the same weights.
TEST(Bf16Training, CheckpointsHoldFp32MastersAndResumeInEitherPrecision) {
  auto dir = temp_dir("bf16_resume");
  TrainConfig c = bf16_config(dir);
  c.steps = 6;
  c.save = (dir / "a").string();
  c.save_every = 3;
  const TrainResult whole = run_training(c, nullptr);
  const auto ckpt = dir / "a" / "step-00000003";
  {
    io::SafetensorsFile weights(dir / "a" / "model.safetensors");
    for (const std::string& n : weights.names()) EXPECT_EQ(weights.info(n).dtype, DType::F32) << n;
  }
  TrainConfig r = bf16_config(dir);
  r.steps = 6;
  r.resume = ckpt.string();
  testing::expect_resumed(whole, run_training(r, nullptr), 3);

  r.precision = "fp32";
  const TrainResult fp32 = run_training(r, nullptr);
  ASSERT_EQ(fp32.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(fp32.losses[i], whole.losses[3 + i]);
    EXPECT_NEAR(fp32.losses[i], whole.losses[3 + i], 2e-2 * whole.losses[3 + i])
        << "step " << 4 + i;
  }
}

// --grad-reduce-dtype bf16 rounds each bucket once before the reduction: every ZeRO stage stays
// within 1e-3 of the fp32 reduction, but differs from it (the rounding happens), with half the
// gradient bytes on the wire.
TEST(Bf16Training, GradientsReduceInBf16UnderEveryZeroStage) {
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    auto dir = temp_dir("bf16_reduce_" + std::to_string(zero));
    TrainConfig c = bf16_config(dir);
    c.dp = 2;
    c.zero = zero;
    const TrainResult f = run_training(c, nullptr);
    c.grad_reduce_dtype = "bf16";
    const TrainResult b = run_training(c, nullptr);
    const double d = max_rel_loss_diff(f.losses, b.losses);
    EXPECT_LE(d, 1e-3);
    EXPECT_GT(d, 0.0) << "the bf16 reduction changed nothing";
    // Gradient bytes halve; ZeRO's parameter all-gathers (each as large as one reduce-scatter)
    // stay fp32. Per step, with 2 micro-batches per rank: ZeRO-1 1 reduce-scatter + 1 all-gather;
    // ZeRO-2 2 + 1; ZeRO-3 2 + 4 (forward and backward of each micro-batch).
    const double ratio[] = {0.5, 1.5 / 2, 2.0 / 3, 5.0 / 6};
    EXPECT_NEAR(b.comm_bytes_per_step, ratio[zero] * f.comm_bytes_per_step,
                1e-6 * f.comm_bytes_per_step);
    std::printf("[ grad reduce bf16, zero %d ] max relative loss difference to fp32: %.2e\n", zero,
                d);
  }
}

// --export-dtype bf16 writes model.safetensors in BF16 (the rounded masters); eval-style loading
// reads it back as fp32.
TEST(Bf16Training, ExportsBf16Safetensors) {
  auto dir = temp_dir("bf16_export");
  TrainConfig c = bf16_config(dir);
  c.steps = 2;
  c.save = (dir / "a").string();
  c.export_dtype = "bf16";
  run_training(c, nullptr);
  io::SafetensorsFile weights(dir / "a" / "model.safetensors");
  const auto values = testing::read_weights(dir / "a" / "model.safetensors");
  ASSERT_FALSE(values.empty());
  for (const std::string& n : weights.names()) {
    EXPECT_EQ(weights.info(n).dtype, DType::BF16) << n;
    for (float v : values.at(n)) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      ASSERT_EQ(u & 0xffffu, 0u) << n << " holds a value that is not a bf16";
    }
  }
  c.export_dtype = "fp16";
  EXPECT_NE(testing::config_error_of(c).find("--export-dtype must be fp32 or bf16"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::train
