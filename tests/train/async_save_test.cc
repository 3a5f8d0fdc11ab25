// --save-async (docs/RELIABILITY.md): checkpoints written by a background thread while training
// goes on. The checkpoints are byte for byte those of synchronous saves (the state is copied at the
// step boundary, not read while the next steps change it); a run resumed from one continues the
// uninterrupted run bitwise; a stop while a write is in flight waits for it; a write that fails
// ends the run with its error. tests/apps/async_save_test.sh kills a process mid-write and sends
// real signals. TESSERA_SAVE_DELAY_MS makes each write sleep after its model file.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/background_writer.h"
#include "tessera/io/checkpoint.h"
#include "tessera/train/stop_request.h"
#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::temp_dir;
using testing::tiny_config;

// Sets TESSERA_SAVE_DELAY_MS for its lifetime.
class SaveDelay {
 public:
  explicit SaveDelay(int ms) { ::setenv("TESSERA_SAVE_DELAY_MS", std::to_string(ms).c_str(), 1); }
  ~SaveDelay() { ::unsetenv("TESSERA_SAVE_DELAY_MS"); }
};

// Requests a stop (as SIGINT would) while rank 0 fetches the first micro-batch of step `at`
// (counted from 0): the run stops after that step.
class StopAtStep {
 public:
  explicit StopAtStep(int64_t at) {
    set_batch_observer([at](int rank, int64_t step, int, int, int, const int32_t*) {
      if (rank == 0 && step == at) request_stop(SIGINT);
    });
  }
  ~StopAtStep() {
    set_batch_observer(nullptr);
    clear_stop_request();
  }
};

std::string file_of(const fs::path& p) {
  return io::read_file(p);
}

bool complete(const fs::path& step_dir) {
  return fs::is_regular_file(step_dir / io::kStateFile);
}

TEST(BackgroundWriter, RunsOneJobAndHandsBackItsResultOrError) {
  io::BackgroundWriter w;
  EXPECT_FALSE(w.busy());
  EXPECT_FALSE(w.poll().has_value());
  w.start("job a", [] { return std::string("a"); });
  EXPECT_TRUE(w.busy());
  EXPECT_THROW(w.start("job b", [] { return std::string("b"); }), Error);  // one at a time
  EXPECT_EQ(w.wait(std::chrono::seconds(10), "--io-timeout"), "a");
  EXPECT_FALSE(w.busy());

  w.start("job c", []() -> std::string { throw IoError("disk full"); });
  std::optional<std::string> r;
  const auto t0 = Clock::now();
  for (;;) {
    try {
      r = w.poll();
    } catch (const IoError& e) {
      EXPECT_STREQ(e.what(), "disk full");
      break;
    }
    ASSERT_FALSE(r.has_value());
    ASSERT_LT(Clock::now() - t0, std::chrono::seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(w.busy());  // collected with its error
}

TEST(BackgroundWriter, AWaitPastItsTimeoutAbandonsTheJob) {
  io::BackgroundWriter w;
  auto release = std::make_shared<std::atomic<bool>>(false);
  w.start("checkpoint step 7 to 'x'", [release] {
    while (!*release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return std::string("late");
  });
  try {
    w.wait(std::chrono::milliseconds(50), "--io-timeout");
    FAIL() << "no timeout";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "the background write of checkpoint step 7 to 'x' did not finish within "
                  "--io-timeout (0.05 s)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(w.busy());
  *release = true;  // the abandoned job ends on its own
  w.start("next", [] { return std::string("ok"); });
  EXPECT_EQ(w.wait(std::chrono::seconds(10), "--io-timeout"), "ok");
}

// The checkpoints of a run with --save-async are those of synchronous saves, byte for byte, even
// when each write takes longer than the steps after it (ZeRO-0: the gathered tensors are views of
// the live parameters, so a write that read them late would save later values).
TEST(AsyncSave, WritesTheSameBytesAsSynchronousSaves) {
  auto dir = temp_dir("async_bytes");
  TrainConfig c = tiny_config(dir);
  c.steps = 8;
  c.save_every = 2;
  TrainConfig sync = c, async = c;
  sync.save = (dir / "sync").string();
  sync.save_async = false;
  async.save = (dir / "async").string();
  async.save_async = true;
  const TrainResult a = run_training(sync, nullptr);
  TrainResult b;
  {
    SaveDelay slow(200);  // each write outlasts several steps of this model
    b = run_training(async, nullptr);
  }
  EXPECT_EQ(a.losses, b.losses);  // saving changes nothing
  EXPECT_EQ(b.checkpoint, (dir / "async" / "step-00000008").string());
  // keep_last 2: steps 6 and 8 remain.
  for (const char* step : {"step-00000006", "step-00000008"}) {
    ASSERT_TRUE(complete(dir / "sync" / step)) << step;
    ASSERT_TRUE(complete(dir / "async" / step)) << step;
    for (const char* f : {io::kModelFile, io::kOptimizerFile})
      EXPECT_TRUE(file_of(dir / "sync" / step / f) == file_of(dir / "async" / step / f))
          << step << "/" << f << " differs";
    EXPECT_NO_THROW(io::load_checkpoint(dir / "async" / step));
  }
  EXPECT_TRUE(file_of(dir / "sync" / io::kModelFile) == file_of(dir / "async" / io::kModelFile));
  EXPECT_FALSE(fs::exists(dir / "async" / "step-00000002"));
  EXPECT_FALSE(fs::exists(dir / "async" / "step-00000004"));
}

// Saved every 3 steps in the background (dp 2, ZeRO-1), each write slower than the steps after
// it, and resumed from the one of step 6: the losses and the final weights and optimizer state of
// the uninterrupted run, bit for bit.
TEST(AsyncSave, ResumesBitwiseAsTheUninterruptedRun) {
  auto dir = temp_dir("async_resume");
  TrainConfig c = tiny_config(dir);
  c.steps = 9;
  c.dp = 2;
  c.zero = 1;
  TrainConfig whole = c;
  whole.save = (dir / "whole").string();
  whole.save_async = false;
  const TrainResult w = run_training(whole, nullptr);

  TrainConfig first = c;
  first.save = (dir / "a").string();
  first.save_every = 3;  // 3 and 6 in the background, 9 at the end; 6 and 9 are kept
  TrainResult p1;
  {
    SaveDelay slow(100);
    p1 = run_training(first, nullptr);
  }
  EXPECT_EQ(p1.losses, w.losses);  // saving changes nothing
  TrainConfig r = c;
  r.resume = (dir / "a" / "step-00000006").string();
  r.save = (dir / "r").string();
  const TrainResult p2 = run_training(r, nullptr);
  ASSERT_EQ(p2.first_step, 6);
  ASSERT_EQ(p2.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(p2.losses[i], w.losses[6 + i]) << "step " << 7 + i;
  for (const char* f : {io::kModelFile, io::kOptimizerFile})
    EXPECT_TRUE(file_of(dir / "whole" / "step-00000009" / f) ==
                file_of(dir / "r" / "step-00000009" / f))
        << "the final " << f << " differs";
}

// A stop while the write of step 2 is in flight: the run stops after step 3, waits for step 2's
// write and saves step 3; both checkpoints are complete.
TEST(AsyncSave, AStopWaitsForTheWriteInFlight) {
  auto dir = temp_dir("async_stop");
  TrainConfig c = tiny_config(dir);
  c.steps = 50;
  c.dp = 2;
  c.save_every = 2;
  c.save = (dir / "ckpt").string();
  const int delay_ms = 1500;
  TrainResult r;
  const auto t0 = Clock::now();
  {
    SaveDelay slow(delay_ms);
    StopAtStep stop(2);  // seen during step 3 (the write of step 2 has just begun)
    r = run_training(c, nullptr);
  }
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(delay_ms));
  EXPECT_EQ(r.stopped_by, SIGINT);
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(r.checkpoint, (dir / "ckpt" / "step-00000003").string());
  EXPECT_TRUE(complete(dir / "ckpt" / "step-00000002"));
  EXPECT_TRUE(complete(dir / "ckpt" / "step-00000003"));
  EXPECT_EQ(file_of(dir / "ckpt" / io::kLatestFile), "step-00000003\n");
  EXPECT_NO_THROW(io::load_checkpoint(dir / "ckpt" / "step-00000002"));
  EXPECT_NO_THROW(io::load_checkpoint(dir / "ckpt" / "step-00000003"));

  // Stopped right after the step whose checkpoint went to the background: it is waited for and
  // named as the checkpoint to resume.
  TrainConfig c2 = c;
  c2.save = (dir / "ckpt2").string();
  {
    SaveDelay slow(delay_ms);
    StopAtStep stop(1);  // seen during step 2, saved in the background after it
    r = run_training(c2, nullptr);
  }
  EXPECT_EQ(r.stopped_by, SIGINT);
  EXPECT_EQ(r.steps, 2);
  EXPECT_EQ(r.checkpoint, (dir / "ckpt2" / "step-00000002").string());
  EXPECT_EQ(file_of(dir / "ckpt2" / io::kLatestFile), "step-00000002\n");
  EXPECT_NO_THROW(io::load_checkpoint(dir / "ckpt2"));
}

// A background write that fails (here `latest` cannot be replaced: a directory holds its name)
// ends the run with the save's error, on every rank, before the run's end.
TEST(AsyncSave, AFailedBackgroundWriteEndsTheRunWithItsError) {
  auto dir = temp_dir("async_fail");
  TrainConfig c = tiny_config(dir);
  c.steps = 40;
  c.dp = 2;
  c.save_every = 2;
  c.save = (dir / "ckpt").string();
  fs::create_directories(dir / "ckpt" / io::kLatestFile / "in-the-way");
  std::mutex mu;
  int64_t last_step = -1;
  set_batch_observer([&](int, int64_t step, int, int, int, const int32_t*) {
    std::lock_guard<std::mutex> lock(mu);
    last_step = std::max(last_step, step);
  });
  try {
    run_training(c, nullptr);
    ADD_FAILURE() << "the failed write went unnoticed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("could not save checkpoint step-00000002 in " + c.save),
              std::string::npos)
        << e.what();
  }
  set_batch_observer(nullptr);
  EXPECT_LT(last_step, 39) << "the run went on to its end";
}

}  // namespace
}  // namespace tessera::train
