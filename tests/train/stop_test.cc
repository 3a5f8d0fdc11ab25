// A clean stop at the library level (train/stop_request.h): a stop request ends the run after the
// step it is in with a checkpoint, on every rank at the same step, and resuming from it gives the
// uninterrupted run's losses bit for bit. tests/apps/stop_test.sh sends real signals.
#include <gtest/gtest.h>

#include <csignal>

#include "tessera/train/stop_request.h"
#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

using testing::temp_dir;
using testing::tiny_config;

TEST(CleanStop, StopsAfterTheStepSavesAndResumesBitwise) {
  auto dir = temp_dir("stop");
  TrainConfig c = tiny_config(dir);
  c.dp = 2;
  c.zero = 1;
  const TrainResult whole = run_training(c, nullptr);
  ASSERT_EQ(whole.stopped_by, 0);

  TrainConfig stopped = c;
  stopped.save = (dir / "ckpt").string();
  request_stop(SIGTERM);  // seen after the first step: the run stops there
  const TrainResult part1 = run_training(stopped, nullptr);
  clear_stop_request();
  EXPECT_EQ(part1.stopped_by, SIGTERM);
  EXPECT_EQ(part1.steps, 1);
  ASSERT_EQ(part1.losses.size(), 1u);
  EXPECT_EQ(part1.losses[0], whole.losses[0]);
  EXPECT_EQ(part1.checkpoint, (dir / "ckpt" / "step-00000001").string());

  TrainConfig resumed = c;
  resumed.resume = (dir / "ckpt").string();
  const TrainResult part2 = run_training(resumed, nullptr);
  EXPECT_EQ(part2.stopped_by, 0);
  EXPECT_EQ(part2.first_step, 1);
  ASSERT_EQ(part2.losses.size(), whole.losses.size() - 1);
  for (size_t i = 0; i < part2.losses.size(); ++i)
    EXPECT_EQ(part2.losses[i], whole.losses[i + 1]) << "step " << i + 2;
}

TEST(CleanStop, SignalsSetTheRequestWhileInstalledOnly) {
  {
    StopSignals signals(/*announce=*/false);
    EXPECT_EQ(stop_requested(), 0);
    std::raise(SIGUSR1);
    EXPECT_EQ(stop_requested(), SIGUSR1);
    clear_stop_request();
  }
  EXPECT_STREQ(signal_name(SIGINT), "SIGINT");
  EXPECT_STREQ(signal_name(SIGTERM), "SIGTERM");
  struct sigaction now;
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);  // restored
}

}  // namespace
}  // namespace tessera::train
