#include "tessera/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/io/safetensors.h"
#include "tessera/train/model_io.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

using testing::temp_dir;
using testing::tiny_config;

TEST(Trainer, SameSeedGivesBitwiseIdenticalLosses) {
  auto dir = temp_dir("determinism");
  TrainConfig c = tiny_config(dir);
  TrainResult a = run_training(c, nullptr);
  TrainResult b = run_training(c, nullptr);
  ASSERT_EQ(a.losses.size(), 6u);
  EXPECT_EQ(a.losses, b.losses);  // bitwise, dropout on
  c.seed = 7;
  TrainResult other = run_training(c, nullptr);
  EXPECT_NE(a.losses, other.losses);
}

TEST(Trainer, LossFallsAndValidationBeatsUnigramEntropy) {
  auto dir = temp_dir("learns");
  TrainConfig c = tiny_config(dir);
  c.steps = 60;
  c.dropout = 0;
  c.val_fraction = 0.1;
  c.lr = 1e-2f;
  TrainResult r = run_training(c, nullptr);
  EXPECT_LT(r.losses.back(), r.losses.front() - 1.0);
  ASSERT_GE(r.last_val_loss, 0);
  EXPECT_LT(r.last_val_loss, r.unigram_entropy);
}

// Validation reads the same windows in every layout (--eval-batches batches of --batch
// sequences): data parallelism and gradient accumulation, which shrink the micro-batch, report the
// validation loss of one rank (it used to read eval_batches micro-batches: fewer windows).
TEST(Trainer, ValidationLossDoesNotDependOnTheLayout) {
  auto dir = temp_dir("val_layout");
  TrainConfig c = tiny_config(dir);
  c.steps = 3;
  c.dropout = 0;
  c.val_fraction = 0.2;
  c.eval_every = 3;
  c.eval_batches = 2;
  const TrainResult one = run_training(c, nullptr);
  ASSERT_GT(one.last_val_loss, 0);
  c.dp = 2;
  const TrainResult two = run_training(c, nullptr);
  EXPECT_NEAR(two.last_val_loss, one.last_val_loss, 1e-5 * one.last_val_loss);
  c.dp = 1;
  c.micro_batch = c.batch / 4;
  const TrainResult accumulated = run_training(c, nullptr);
  EXPECT_NEAR(accumulated.last_val_loss, one.last_val_loss, 1e-5 * one.last_val_loss);
}

// MFU = model FLOP/s / (peak per rank x ranks): on the progress line and in the metrics, against
// --peak-gflops when given, else against a GEMM measured at start.
TEST(Trainer, ReportsModelFlopUtilisation) {
  auto dir = temp_dir("mfu");
  TrainConfig c = tiny_config(dir);
  c.dp = 2;
  c.peak_gflops = 0.5;
  c.metrics = (dir / "metrics.jsonl").string();
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* log = open_memstream(&buf, &len);
  run_training(c, log);
  std::fclose(log);
  const std::string text(buf, len);
  std::free(buf);
  EXPECT_NE(text.find("MFU against 500.00MFLOP/s per rank (--peak-gflops) x 2 ranks"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("| MFU "), std::string::npos) << text;
  std::ifstream in(c.metrics);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("mfu")) continue;
    ++steps;
    EXPECT_NEAR(j["mfu"].get<double>(), j["flops_per_s"].get<double>() / (0.5e9 * 2), 1e-12);
  }
  EXPECT_EQ(steps, c.steps);
  c.peak_gflops = 0;  // measured: some positive rate
  c.dp = 1;
  c.metrics = (dir / "measured.jsonl").string();
  run_training(c, nullptr);
  std::ifstream m(c.metrics);
  ASSERT_TRUE(std::getline(m, line));
  while (!nlohmann::json::parse(line).contains("mfu")) ASSERT_TRUE(std::getline(m, line));
  EXPECT_GT(nlohmann::json::parse(line)["mfu"].get<double>(), 0.0);
  c.peak_gflops = -1;
  EXPECT_NE(testing::config_error_of(c).find("--peak-gflops must be >= 0 (0: measure it at start)"),
            std::string::npos);
}

TEST(Trainer, ResumeContinuesBitwiseIdentically) {
  auto dir = temp_dir("resume");
  TrainConfig c = tiny_config(dir);
  TrainResult whole = run_training(c, nullptr);

  TrainConfig first = c;
  first.save = (dir / "ckpt").string();
  first.save_every = 3;
  TrainResult part1 = run_training(first, nullptr);
  EXPECT_EQ(part1.losses, whole.losses);  // saving changes nothing

  TrainConfig second = c;
  second.resume = (dir / "ckpt" / "step-00000003").string();
  TrainResult part2 = run_training(second, nullptr);
  EXPECT_EQ(part2.first_step, 3);
  ASSERT_EQ(part2.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(part2.losses[i], whole.losses[3 + i]) << "step " << 4 + i;
}

// The loss is normalised by the global token count, so splitting the batch into micro-batches
// changes nothing beyond fp32 rounding.
TEST(Trainer, MicroBatchesMatchTheWholeBatch) {
  auto dir = temp_dir("micro");
  TrainConfig c = tiny_config(dir);
  TrainResult whole = run_training(c, nullptr);
  c.micro_batch = 1;
  TrainResult split = run_training(c, nullptr);
  ASSERT_EQ(split.losses.size(), whole.losses.size());
  for (size_t i = 0; i < whole.losses.size(); ++i)
    EXPECT_NEAR(split.losses[i], whole.losses[i], 1e-5 * std::abs(whole.losses[i]));
}

TEST(Trainer, ExportedWeightsReloadWithHuggingFaceNames) {
  auto dir = temp_dir("export");
  TrainConfig c = tiny_config(dir);
  c.save = (dir / "run").string();
  c.steps = 2;
  run_training(c, nullptr);
  io::SafetensorsFile f(dir / "run" / "model.safetensors");
  EXPECT_TRUE(f.contains("h.1.attn.c_attn.weight"));
  EXPECT_EQ(f.shape("h.1.attn.c_attn.weight"), (Shape{32, 96}));
  EXPECT_EQ(f.shape("wte.weight"), (Shape{300, 32}));
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "tokenizer.json"));
  // Fine-tuning from the exported weights starts where training ended.
  TrainConfig ft = tiny_config(dir);
  ft.init_from = (dir / "run" / "model.safetensors").string();
  ft.steps = 1;
  TrainResult r = run_training(ft, nullptr);
  EXPECT_EQ(r.losses.size(), 1u);
}

// Weights alone do not say how many heads the model has: config.json beside them does, or --heads.
TEST(Trainer, InitFromWeightsWithoutConfigNeedsHeads) {
  auto dir = temp_dir("heads");
  TrainConfig c = tiny_config(dir);
  c.save = (dir / "run").string();
  c.steps = 1;
  run_training(c, nullptr);
  std::filesystem::remove(dir / "run" / "config.json");
  TrainConfig ft = tiny_config(dir);
  ft.heads = 0;
  ft.init_from = (dir / "run" / "model.safetensors").string();
  ft.steps = 1;
  try {
    run_training(ft, nullptr);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--heads"), std::string::npos) << e.what();
  }
  ft.heads = 2;
  EXPECT_EQ(run_training(ft, nullptr).losses.size(), 1u);
}

TEST(Trainer, NonFiniteWeightsStopNamingStepAndTensor) {
  auto dir = temp_dir("nan");
  TrainConfig c = tiny_config(dir);
  c.save = (dir / "run").string();
  c.steps = 1;
  run_training(c, nullptr);
  // Poison one weight and train from it.
  io::SafetensorsFile f(dir / "run" / "model.safetensors");
  io::NamedTensors ts;
  for (const std::string& n : f.names()) {
    Tensor t = f.read_f32(n);
    if (n == "h.0.mlp.c_fc.weight") t.f32()[5] = NAN;
    ts.emplace_back(n, t);
  }
  std::filesystem::create_directories(dir / "bad");
  io::save_safetensors(dir / "bad" / "model.safetensors", ts);
  std::filesystem::copy_file(dir / "run" / "config.json", dir / "bad" / "config.json");
  std::filesystem::copy_file(dir / "run" / "tokenizer.json", dir / "bad" / "tokenizer.json");
  TrainConfig bad = tiny_config(dir);
  bad.init_from = (dir / "bad").string();
  try {
    run_training(bad, nullptr);
    FAIL() << "expected NumericError";
  } catch (const NumericError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("step 1"), std::string::npos) << m;
    EXPECT_NE(m.find("h.0.mlp.c_fc.weight"), std::string::npos) << m;
  }
}

TEST(Trainer, BadInputIsAClearError) {
  auto dir = temp_dir("bad");
  TrainConfig c = tiny_config(dir);
  c.heads = 3;  // does not divide 32
  EXPECT_THROW(run_training(c, nullptr), ConfigError);
  c = tiny_config(dir);
  c.data = (dir / "no_such_file.txt").string();
  EXPECT_THROW(run_training(c, nullptr), ConfigError);
  c = tiny_config(dir);
  std::ofstream(dir / "a_file") << "x";
  c.save = (dir / "a_file" / "ckpt").string();  // parent is a file: unwritable
  EXPECT_THROW(run_training(c, nullptr), IoError);
  c = tiny_config(dir);
  c.memory_limit = "64KiB";
  EXPECT_THROW(run_training(c, nullptr), OutOfMemory);
  c = tiny_config(dir);
  c.resume = (dir / "nothing_here").string();
  EXPECT_THROW(run_training(c, nullptr), ConfigError);
}

}  // namespace
}  // namespace tessera::train
