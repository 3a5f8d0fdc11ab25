#include "tessera/io/checkpoint.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace tessera::io {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::slurp;
using testing::spit;
namespace fs = std::filesystem;

class CheckpointTest : public testing::TempDirTest {
 protected:
  Checkpoint make(int64_t step) const {
    Checkpoint c;
    c.step = step;
    c.config.n_layer = 1;
    c.config.n_head = 2;
    c.config.n_embd = 4;
    c.config.n_positions = 8;
    c.config.vocab_size = 16;
    const float s = static_cast<float>(step);
    c.model = {{"wte.weight", Tensor::from(std::vector<float>(64, s), {16, 4})},
               {"ln_f.bias", Tensor::from({s, 1, 2, 3}, {4})}};
    c.optimizer = {{"exp_avg.wte.weight", Tensor::from(std::vector<float>(64, -s), {16, 4})},
                   {"exp_avg_sq.wte.weight", Tensor::from(std::vector<float>(64, 0.5f), {16, 4})}};
    c.state = {{"rng", {{"seed", 1337}, {"offset", step * 10}}},
               {"sampler", {{"epoch", 0}, {"position", step * 8}}},
               {"train_config", {{"lr", 6e-4}, {"batch_size", 8}}}};
    return c;
  }
  fs::path ckdir() const { return dir_ / "ckpt"; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(ckdir())) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  void flip_byte(const fs::path& p, size_t from_end) {
    std::string bytes = slurp(p);
    bytes[bytes.size() - from_end] ^= 0x01;
    spit(p, bytes);
  }
};

TEST_F(CheckpointTest, RoundTrip) {
  const Checkpoint c = make(100);
  const fs::path step_dir = save_checkpoint(ckdir(), c);
  EXPECT_EQ(step_dir, ckdir() / "step-00000100");
  EXPECT_EQ(slurp(ckdir() / "latest"), "step-00000100\n");
  for (const char* f : {kModelFile, kOptimizerFile, kConfigFile, kStateFile})
    EXPECT_TRUE(fs::is_regular_file(step_dir / f)) << f;

  const LoadedCheckpoint l = load_checkpoint(ckdir());
  EXPECT_EQ(l.dir, step_dir);
  EXPECT_EQ(l.step, 100);
  EXPECT_EQ(l.config, c.config);
  EXPECT_EQ(l.state, c.state);
  EXPECT_EQ(l.tessera_version, std::string(library_version()));
  EXPECT_EQ(l.model.metadata().at("format"), "pt");
  EXPECT_EQ(l.model.names(), (std::vector<std::string>{"ln_f.bias", "wte.weight"}));
  EXPECT_EQ(l.model.read_f32("ln_f.bias").to_vector(), (std::vector<float>{100, 1, 2, 3}));
  EXPECT_EQ(l.optimizer.read_f32("exp_avg.wte.weight").to_vector(),
            std::vector<float>(64, -100.0f));
  // A ZeRO shard reads just its slice of a global tensor.
  std::vector<float> shard(16);
  l.optimizer.read_slice_f32("exp_avg_sq.wte.weight", 32, 16, shard.data());
  EXPECT_EQ(shard, std::vector<float>(16, 0.5f));

  // state.json records sizes and CRC-32s.
  const json state = json::parse(slurp(step_dir / kStateFile));
  EXPECT_EQ(state["files"][kModelFile]["bytes"], fs::file_size(step_dir / kModelFile));
  EXPECT_EQ(state["files"][kModelFile]["crc32"],
            crc32_hex(digest_file(step_dir / kModelFile).crc32));
}

TEST_F(CheckpointTest, CorruptByteIsAChecksumError) {
  save_checkpoint(ckdir(), make(100));
  const fs::path model = ckdir() / "step-00000100" / kModelFile;
  flip_byte(model, 3);  // inside the tensor data: the header still parses
  expect_error<IoError>(
      [&] { load_checkpoint(ckdir()); },
      {"checksum mismatch in " + model.string(), "the file is corrupt; use an earlier checkpoint"});
  CheckpointLoadOptions no_verify;
  no_verify.verify_checksums = false;
  EXPECT_EQ(load_checkpoint(ckdir(), no_verify).step, 100);

  const fs::path config = ckdir() / "step-00000100" / kConfigFile;
  flip_byte(model, 3);  // repaired
  flip_byte(config, 2);
  expect_error<IoError>([&] { load_checkpoint(ckdir()); },
                        {"checksum mismatch in " + config.string()});
}

TEST_F(CheckpointTest, TruncatedOrMissingFile) {
  save_checkpoint(ckdir(), make(100));
  const fs::path opt = ckdir() / "step-00000100" / kOptimizerFile;
  const std::string bytes = slurp(opt);
  spit(opt, bytes.substr(0, bytes.size() - 10));
  expect_error<IoError>([&] { load_checkpoint(ckdir()); },
                        {"size mismatch in " + opt.string(), "use an earlier checkpoint"});
  fs::remove(opt);
  expect_error<IoError>([&] { load_checkpoint(ckdir()); }, {opt.string(), "is missing"});
  spit(ckdir() / "step-00000100" / kStateFile, "{\"format\": ");
  expect_error<IoError>([&] { load_checkpoint(ckdir()); }, {"state.json", "not valid JSON"});
}

TEST_F(CheckpointTest, StateMustBeAnObjectAndStepNonNegative) {
  // Found by fuzzing: both loaded, and the trainer then failed on the state (docs/RELIABILITY.md).
  save_checkpoint(ckdir(), make(100));
  const fs::path state_file = ckdir() / "step-00000100" / kStateFile;
  const json saved = json::parse(slurp(state_file));
  json bad = saved;
  bad["state"] = 5;
  spit(state_file, bad.dump());
  expect_error<IoError>([&] { load_checkpoint(ckdir()); },
                        {"state.json", "\"state\" that is not an object"});
  bad = saved;
  bad["step"] = -3;
  spit(state_file, bad.dump());
  expect_error<IoError>([&] { load_checkpoint(ckdir()); },
                        {"state.json", "\"step\" that is not a non-negative integer: -3"});
}

TEST_F(CheckpointTest, CrashLeftoversFallBackToPreviousCheckpoint) {
  save_checkpoint(ckdir(), make(100));
  save_checkpoint(ckdir(), make(200));
  // A save of step 300 died mid-write: a staging directory with a partial model file, a
  // latest.tmp from an interrupted pointer update.
  fs::create_directories(ckdir() / "step-00000300.tmp");
  spit(ckdir() / "step-00000300.tmp" / kModelFile, "partial");
  spit(ckdir() / "latest.tmp.123.abcdef", "step-00000300\n");
  // A removal of an old checkpoint died half-way: it was renamed to .old first, so it is ignored.
  fs::create_directories(ckdir() / "step-00000500.old");
  spit(ckdir() / "step-00000500.old" / kStateFile, "{}");
  EXPECT_EQ(load_checkpoint(ckdir()).step, 200);
  EXPECT_EQ(list_checkpoints(ckdir()).size(), 2u);

  // A step directory without state.json is incomplete and never chosen, even when `latest`
  // names it or is missing.
  fs::create_directories(ckdir() / "step-00000400");
  spit(ckdir() / "step-00000400" / kModelFile, "partial");
  EXPECT_EQ(load_checkpoint(ckdir()).step, 200);
  spit(ckdir() / "latest", "step-00000400\n");
  EXPECT_EQ(load_checkpoint(ckdir()).step, 200);
  fs::remove(ckdir() / "latest");
  EXPECT_EQ(load_checkpoint(ckdir()).step, 200);
  spit(ckdir() / "latest", "garbage/../..\n");
  EXPECT_EQ(load_checkpoint(ckdir()).step, 200);
  fs::remove_all(ckdir() / "step-00000400");

  // The next save cleans up the leftovers.
  save_checkpoint(ckdir(), make(300));
  EXPECT_EQ(entries(), (std::vector<std::string>{"latest", "step-00000200", "step-00000300"}));
  EXPECT_EQ(load_checkpoint(ckdir()).step, 300);
  // An earlier checkpoint stays loadable by its directory.
  EXPECT_EQ(load_checkpoint(ckdir() / "step-00000200").step, 200);
}

TEST_F(CheckpointTest, CrashAfterRenameBeforeLatestUsesThePointer) {
  save_checkpoint(ckdir(), make(100));
  save_checkpoint(ckdir(), make(200));
  spit(ckdir() / "latest", "step-00000100\n");  // as if the pointer update never happened
  EXPECT_EQ(load_checkpoint(ckdir()).step, 100);
}

TEST_F(CheckpointTest, KeepsTheLastK) {
  for (int64_t s = 1; s <= 5; ++s) save_checkpoint(ckdir(), make(s * 10));
  EXPECT_EQ(entries(), (std::vector<std::string>{"latest", "step-00000040", "step-00000050"}));
  CheckpointOptions three;
  three.keep_last = 3;
  for (int64_t s = 6; s <= 8; ++s) save_checkpoint(ckdir(), make(s * 10), three);
  auto all = list_checkpoints(ckdir());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.front().first, 60);
  EXPECT_EQ(all.back().first, 80);
  CheckpointOptions zero;
  zero.keep_last = 0;
  EXPECT_THROW(save_checkpoint(ckdir(), make(90), zero), ConfigError);
}

TEST_F(CheckpointTest, ResavingAStepReplacesIt) {
  save_checkpoint(ckdir(), make(100));
  Checkpoint c = make(100);
  c.state["note"] = "second";
  save_checkpoint(ckdir(), c);
  EXPECT_EQ(load_checkpoint(ckdir()).state["note"], "second");
}

TEST_F(CheckpointTest, EmptyOrMissingDirectory) {
  expect_error<IoError>([&] { load_checkpoint(ckdir()); },
                        {"no complete checkpoint in " + ckdir().string()});
  EXPECT_FALSE(find_latest_checkpoint(ckdir()).has_value());
  EXPECT_TRUE(list_checkpoints(ckdir()).empty());
}

TEST_F(CheckpointTest, FailedSaveLeavesPreviousCheckpointAndNoStaging) {
  save_checkpoint(ckdir(), make(100));
  Checkpoint bad = make(200);
  bad.optimizer.emplace_back("exp_avg.wte.weight", Tensor::zeros({1}));  // duplicate name
  EXPECT_THROW(save_checkpoint(ckdir(), bad), IoError);
  EXPECT_EQ(entries(), (std::vector<std::string>{"latest", "step-00000100"}));
  EXPECT_EQ(load_checkpoint(ckdir()).step, 100);
}

TEST_F(CheckpointTest, UnwritableLocation) {
  spit(dir_ / "file", "x");
  expect_error<IoError>([&] { save_checkpoint(dir_ / "file" / "ckpt", make(1)); },
                        {(dir_ / "file" / "ckpt").string()});
}

}  // namespace
}  // namespace tessera::io
