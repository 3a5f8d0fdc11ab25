// `tessera train --device cuda` (train/device_steps.h) against the same run on the CPU: the
// losses of every step within 1e-4 (fp32), for one rank and for data-parallel thread ranks
// sharing the device, with micro-batches, dropout and clipping; a checkpoint saved on the device
// resumes on the device and on the CPU as an uninterrupted run continues; and the layouts the
// device does not run yet are refused by name. The device runs skip where no GPU is present; the
// refusals run everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/cuda/runtime.h"
#include "tessera/train/device_steps.h"
#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

using testing::config_error_of;
using testing::temp_dir;
using testing::tiny_config;

TrainConfig device_config(const std::filesystem::path& dir) {
  TrainConfig c = tiny_config(dir);
  c.batch = 8;
  c.micro_batch = 2;  // several micro-batches per rank
  c.steps = 8;
  c.grad_clip = 0.5f;  // exercised early on
  c.val_fraction = 0;
  return c;
}

void expect_same_losses(const std::vector<double>& gpu, const std::vector<double>& cpu,
                        double tol) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t s = 0; s < cpu.size(); ++s)
    EXPECT_NEAR(gpu[s], cpu[s], tol * std::abs(cpu[s])) << "step " << s + 1;
}

TEST(DeviceTraining, TrainsWhatTheCpuTrains) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = temp_dir("device_train");
  TrainConfig cpu = device_config(dir);
  cpu.val_fraction = 0.1;  // validated at the end: on the device too
  const TrainResult want = run_training(cpu, nullptr);
  ASSERT_TRUE(std::isfinite(want.last_val_loss));
  for (int dp : {1, 2}) {
    SCOPED_TRACE("dp " + std::to_string(dp));
    TrainConfig c = cpu;
    c.device = Device::Cuda;
    c.dp = dp;
    c.micro_batch = 2;
    const TrainResult got = run_training(c, nullptr);
    expect_same_losses(got.losses, want.losses, 1e-4);
    EXPECT_NEAR(got.last_val_loss, want.last_val_loss, 1e-4 * want.last_val_loss);
  }
}

TEST(DeviceTraining, CheckpointsResumeOnEitherDevice) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = temp_dir("device_resume");
  // One run of 8 steps that saves after steps 4 and 8; the step-8 checkpoint is then removed, so
  // a resume starts from step 4 with the same learning-rate schedule as the run.
  TrainConfig whole = device_config(dir);
  whole.device = Device::Cuda;
  whole.save = (dir / "ckpt").string();
  whole.save_every = 4;
  const std::vector<double> want = run_training(whole, nullptr).losses;
  ASSERT_EQ(want.size(), 8u);
  std::filesystem::remove_all(dir / "ckpt" / "step-00000008");
  for (Device d : {Device::Cuda, Device::Cpu}) {
    SCOPED_TRACE(d == Device::Cuda ? "resumed on cuda" : "resumed on cpu");
    TrainConfig rest = whole;
    rest.device = d;
    rest.resume = whole.save;
    rest.save = (dir / (d == Device::Cuda ? "cuda" : "cpu")).string();
    const std::vector<double> got = run_training(rest, nullptr).losses;
    ASSERT_EQ(got.size(), 4u);
    for (size_t s = 0; s < 4; ++s)
      EXPECT_NEAR(got[s], want[4 + s], 1e-4 * want[4 + s]) << "step " << 5 + s;
  }
}

TEST(DeviceTraining, RefusesWhatTheDeviceDoesNotRunYet) {
  const auto dir = temp_dir("device_refuse");
  TrainConfig c = device_config(dir);
  c.device = Device::Cuda;
  TrainConfig tp = c;
  tp.tp = 2;
  EXPECT_NE(config_error_of(tp).find("--device cuda does not run tensor, pipeline"),
            std::string::npos)
      << config_error_of(tp);
  TrainConfig zero = c;
  zero.dp = 2;
  zero.zero = 1;
  EXPECT_NE(config_error_of(zero).find("--device cuda does not run --zero 1"), std::string::npos)
      << config_error_of(zero);
  if (!cuda::available()) {
    EXPECT_NE(config_error_of(c).find("no CUDA device"), std::string::npos) << config_error_of(c);
  }
}

// Thread ranks take their world rank's place in the machine, MPI processes the launcher's local
// rank; the device is that place modulo the GPUs visible (0 without any).
TEST(DeviceTraining, RanksSpreadOverTheMachinesDevices) {
  EXPECT_EQ(rank_in_machine(5, false), 5);
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ::unsetenv("MPI_LOCALRANKID");
  EXPECT_EQ(rank_in_machine(7, true), 0);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(rank_in_machine(7, true), 3);
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ::setenv("MPI_LOCALRANKID", "2", 1);
  EXPECT_EQ(rank_in_machine(7, true), 2);
  ::unsetenv("MPI_LOCALRANKID");
  const int n = cuda::device_count();
  for (int r = 0; r < 9; ++r) EXPECT_EQ(device_for_rank(r), n > 0 ? r % n : 0) << "rank " << r;
}

}  // namespace
}  // namespace tessera::train
