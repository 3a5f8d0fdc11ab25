// --precision bf16 (decision 33): every layout family trains the model one bf16 rank trains, within
// 1e-3 relative loss per step (bf16 rounds each GEMM input; layouts only change the order of the
// fp32 sums, and an fp32 difference of 1 ulp can move a rounded input by one bf16 ulp, so equality
// is not bitwise); bf16 stays near fp32; checkpoints hold the fp32 masters and resume in either
// precision. Here parameters and activations travel in fp32; bf16_transport_test.cc sends them in
// bf16 (the default under bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bf16_fixture.h"
#include "run_compare.h"
#include "tessera/io/safetensors.h"
#include "tessera/kernels/precision.h"
#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

using testing::bf16_config;
using testing::max_rel_loss_diff;
using testing::one_bf16_rank;
using testing::temp_dir;

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
  c.schedule = parallel::parse_schedule(l.schedule);
  c.param_gather_dtype = c.activation_comm_dtype = train::WireDtype::Fp32;
  const std::vector<double> got = run_training(c, nullptr).losses;
  const double worst = max_rel_loss_diff(one_bf16_rank(l.moe), got);
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
                                           Layout{"moe_dp2_ep2", 2, 0, 1, 1, 2, false, true},
                                           Layout{"moe_dp2_ep2_tp2_sp", 2, 0, 2, 1, 2, true, true}),
                         [](const auto& info) { return info.param.name; });

// bf16 really changes the numbers (a mode that were ignored would pass every test above), and stays
// close to fp32; both bf16 paths train the same model up to the order of their fp32 sums.
TEST(Bf16Training, DiffersFromFp32ByLittleAndPathsAgree) {
  auto dir = temp_dir("bf16_vs_fp32");
  TrainConfig c = bf16_config(dir);
  c.precision = kernels::Precision::F32;
  const std::vector<double> fp32 = run_training(c, nullptr).losses;
  const std::vector<double>& bf16 = one_bf16_rank(false);
  const double d = max_rel_loss_diff(fp32, bf16);
  EXPECT_GT(d, 1e-6) << "bf16 gave fp32's losses: the precision was not applied";
  EXPECT_LT(d, 2e-2);
  std::printf("[ bf16 vs fp32 ] max relative loss difference: %.2e\n", d);

  c.precision = kernels::Precision::BF16;
  c.bf16_gemm = kernels::Bf16Gemm::Emulated;
  const std::vector<double> emulated = run_training(c, nullptr).losses;
  EXPECT_LE(max_rel_loss_diff(bf16, emulated), 1e-3);  // auto's path, whichever it is
  if (!kernels::onednn_bf16_usable()) return;
  c.bf16_gemm = kernels::Bf16Gemm::OneDnn;
  const double p = max_rel_loss_diff(emulated, run_training(c, nullptr).losses);
  EXPECT_LE(p, 1e-3);
  std::printf("[ bf16 emulated vs onednn ] max relative loss difference: %.2e\n", p);
}

// The suite's small version of the 1% check (bench/precision/curves.sh runs the default job): 60
// steps of a tiny model in fp32 and in bf16 end within 1% of each other, in the mean training loss
// of the last 10 steps and in the final validation loss, after learning something (the loss falls
// by a quarter).
TEST(Bf16Training, ShortRunEndsWithinOnePercentOfFp32) {
  auto dir = temp_dir("bf16_curves");
  TrainConfig c = testing::tiny_config(dir);
  c.steps = 60;
  c.warmup = 5;
  c.lr = 1e-2f;
  c.val_fraction = 0.1;
  const TrainResult fp32 = run_training(c, nullptr);
  c.precision = kernels::Precision::BF16;
  const TrainResult bf16 = run_training(c, nullptr);
  ASSERT_EQ(fp32.losses.size(), 60u);
  ASSERT_EQ(bf16.losses.size(), 60u);
  auto tail_mean = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 10; i < l.size(); ++i) s += l[i];
    return s / 10;
  };
  EXPECT_LT(tail_mean(fp32.losses), 0.75 * fp32.losses.front()) << "the model learned nothing";
  const double train = tail_mean(bf16.losses) / tail_mean(fp32.losses) - 1;
  const double val = bf16.last_val_loss / fp32.last_val_loss - 1;
  EXPECT_LT(std::fabs(train), 0.01);
  EXPECT_LT(std::fabs(val), 0.01);
  EXPECT_NE(bf16.losses.back(), fp32.losses.back()) << "bf16 was not applied";
  std::printf("[ bf16 vs fp32, 60 steps ] last-10 train loss %+.3f%%, validation loss %+.3f%%\n",
              100 * train, 100 * val);
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

  r.precision = kernels::Precision::F32;
  const TrainResult fp32 = run_training(r, nullptr);
  ASSERT_EQ(fp32.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(fp32.losses[i], whole.losses[3 + i]);
    EXPECT_NEAR(fp32.losses[i], whole.losses[3 + i], 2e-2 * whole.losses[3 + i])
        << "step " << 4 + i;
  }
}

// A checkpoint records the bf16 GEMM path its run took; resuming with --bf16-gemm auto keeps it, so
// the continuation is bitwise even where auto would measure the other path faster (the run here
// takes the path auto would not, where both run). A damaged record is an error naming it.
TEST(Bf16Training, ResumeWithAutoKeepsTheCheckpointsGemmPath) {
  const bool both = kernels::onednn_bf16_usable();
  const kernels::Bf16Gemm other =
      both && kernels::resolve_bf16_gemm(kernels::Bf16Gemm::Auto) == kernels::Bf16Gemm::Emulated
          ? kernels::Bf16Gemm::OneDnn
          : kernels::Bf16Gemm::Emulated;
  auto dir = temp_dir("bf16_resume_path");
  TrainConfig c = bf16_config(dir);
  c.steps = 6;
  c.save = (dir / "a").string();
  c.save_every = 3;
  c.bf16_gemm = other;
  const TrainResult whole = run_training(c, nullptr);
  const auto state_file = dir / "a" / "step-00000003" / "state.json";
  std::string state;
  {
    std::ifstream in(state_file);
    state.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string recorded =
      std::string("\"bf16_gemm_path\": \"") + kernels::to_string(other) + "\"";
  ASSERT_NE(state.find(recorded), std::string::npos) << state;

  TrainConfig r = bf16_config(dir);
  r.steps = 6;
  r.resume = state_file.parent_path().string();
  ASSERT_EQ(r.bf16_gemm, kernels::Bf16Gemm::Auto);
  const TrainResult rest = run_training(r, nullptr);
  testing::expect_resumed(whole, rest, 3);
  for (size_t i = 0; i < rest.losses.size(); ++i)  // bitwise (the paths differ by ~1e-6 here)
    EXPECT_EQ(rest.losses[i], whole.losses[3 + i]) << "step " << 4 + i;

  state.replace(state.find(recorded), recorded.size(), "\"bf16_gemm_path\": \"fp8\"");
  std::ofstream(state_file) << state;
  try {
    run_training(r, nullptr);
    FAIL() << "a damaged bf16_gemm_path was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'bf16_gemm_path' must be \"onednn\" or \"emulated\""),
              std::string::npos)
        << e.what();
  }
  r.bf16_gemm = kernels::Bf16Gemm::Emulated;  // an explicit path does not read the record
  EXPECT_NO_THROW(run_training(r, nullptr));
}

// --grad-reduce-dtype bf16 rounds each bucket once before the reduction: every ZeRO stage stays
// within 1e-3 of the fp32 reduction, but differs from it (the rounding happens), with half the
// gradient bytes on the wire (ZeRO-3's parameter gathers kept in fp32 here).
TEST(Bf16Training, GradientsReduceInBf16UnderEveryZeroStage) {
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    auto dir = temp_dir("bf16_reduce_" + std::to_string(zero));
    TrainConfig c = bf16_config(dir);
    c.dp = 2;
    c.zero = zero;
    c.param_gather_dtype = train::WireDtype::Fp32;
    const TrainResult f = run_training(c, nullptr);
    c.grad_reduce_dtype = DType::BF16;
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
  c.export_dtype = DType::BF16;
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
  try {
    train_config_from_json(nlohmann::json{{"export_dtype", "fp16"}});
    ADD_FAILURE() << "export_dtype fp16 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.render(flag_of).find("--export-dtype must be fp32 or bf16, got 'fp16'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessera::train
