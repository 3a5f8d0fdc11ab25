// tessera's Llama family against Hugging Face transformers: tiny random models of each family
// (tests/fixtures/hf/, made by scripts/fixtures/make_hf_fixtures.py with transformers' own
// implementation, fp32, eager attention), the mixtures of experts Mixtral and Qwen2-MoE (with and
// without norm_topk_prob, a dense layer) among them, loaded from their config.json and
// model.safetensors give the reference's logits, loss and every parameter's gradient (the experts'
// too) within 1e-5, and greedy decoding gives the reference's tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/io/hf_config.h"
#include "tessera/io/safetensors.h"
#include "tessera/nn/gpt.h"
#include "tessera/train/model_io.h"
#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

fs::path fixture(const std::string& family) {
  return fs::path(TESSERA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / family;
}

std::vector<int32_t> ints(const io::SafetensorsFile& f, const std::string& name) {
  const Tensor t = f.read_raw(name);
  EXPECT_EQ(t.dtype(), DType::I32) << name;
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

std::vector<float> floats(const io::SafetensorsFile& f, const std::string& name) {
  std::vector<float> v(static_cast<size_t>(f.info(name).numel()));
  f.read_f32(name, v.data(), static_cast<int64_t>(v.size()));
  return v;
}

// ||got - want|| <= rel ||want|| (2-norms, in double).
void expect_close(const float* got, const std::vector<float>& want, double rel,
                  const std::string& what) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_GT(norm, 0.0) << what << " is zero in the reference: the fixture tests nothing";
  EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm)) << what;
}

struct Loaded {
  nn::GPTConfig config;
  Allocator alloc{"hf_reference"};
  std::unique_ptr<nn::GPT> model;
};

std::unique_ptr<Loaded> load(const std::string& family, int max_batch, int block_size) {
  auto l = std::make_unique<Loaded>();
  l->config = from_hf_config(io::read_hf_config(fixture(family) / "config.json"), 0.0f);
  l->config.block_size = block_size;
  // The reference's loss is the cross-entropy alone (transformers adds the load-balancing loss
  // only with output_router_logits): no auxiliary losses in the mixtures' gradients.
  l->config.moe.aux_loss = 0;
  l->config.moe.z_loss = 0;
  l->model = std::make_unique<nn::GPT>(l->config, max_batch, l->alloc);
  load_weights(*l->model, io::SafetensorsFile(fixture(family) / "model.safetensors"));
  return l;
}

class HfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReference, LogitsLossAndGradientsMatchTransformers) {
  const io::SafetensorsFile ref(fixture(GetParam()) / "reference.safetensors");
  const Shape shape = ref.shape("input_ids");
  ASSERT_EQ(shape.size(), 2u);
  const int B = static_cast<int>(shape[0]), T = static_cast<int>(shape[1]);
  auto l = load(GetParam(), B, T);
  nn::GPT& model = *l->model;
  const std::vector<int32_t> tokens = ints(ref, "input_ids"), targets = ints(ref, "targets");
  const int64_t counted =
      std::count_if(targets.begin(), targets.end(), [](int t) { return t >= 0; });
  nn::Batch b{tokens.data(), targets.data(), B, T, 0};
  nn::StepContext ctx;
  ctx.loss_scale = 1.0f / static_cast<float>(counted);
  const double loss = model.forward(b, ctx) / static_cast<double>(counted);
  const float want_loss = floats(ref, "loss")[0];
  EXPECT_NEAR(loss, want_loss, 1e-5 * std::abs(want_loss));
  expect_close(model.logits(), floats(ref, "logits"), 1e-5, "logits");
  for (nn::ParamGroup g : {nn::ParamGroup::Model, nn::ParamGroup::Experts})
    model.params(g).zero_grads();
  model.backward();
  int checked = 0;
  for (nn::ParamGroup g : {nn::ParamGroup::Model, nn::ParamGroup::Experts}) {
    const nn::ParameterSet& ps = model.params(g);
    for (int i = 0; i < ps.size(); ++i) {
      const std::string& name = ps.infos()[i].name;
      ASSERT_TRUE(ref.contains("grad." + name)) << "the reference has no gradient of " << name;
      expect_close(ps.grad_data(i), floats(ref, "grad." + name), 1e-5, name + " (gradient)");
      ++checked;
    }
  }
  const std::vector<std::string> names = ref.names();  // (one list: begin and end of the same)
  EXPECT_EQ(checked,
            static_cast<int>(std::count_if(names.begin(), names.end(),
                                           [](const auto& n) { return n.starts_with("grad."); })))
      << "the reference has gradients of parameters the model lacks";
}

// Greedy decoding (argmax, no sampling) from the fixture's prompt.
TEST_P(HfReference, GreedyDecodingMatchesTransformers) {
  const io::SafetensorsFile ref(fixture(GetParam()) / "reference.safetensors");
  const std::vector<int32_t> want = ints(ref, "greedy");
  std::vector<int32_t> seq = ints(ref, "prompt");
  auto l = load(GetParam(), 1, static_cast<int>(want.size()));
  const int V = l->config.vocab_size;
  while (seq.size() < want.size()) {
    nn::Batch b{seq.data(), nullptr, 1, static_cast<int>(seq.size()), 0};
    nn::StepContext ctx;
    ctx.training = false;
    l->model->forward(b, ctx);
    const float* last = l->model->logits() + (seq.size() - 1) * static_cast<size_t>(V);
    seq.push_back(static_cast<int32_t>(std::max_element(last, last + V) - last));
  }
  EXPECT_EQ(seq, want);
}

INSTANTIATE_TEST_SUITE_P(Families, HfReference,
                         ::testing::Values("llama", "mistral", "qwen2", "mixtral", "qwen2_moe",
                                           "qwen2_moe_norm"),
                         [](const auto& info) { return info.param; });

// Hugging Face's sharded layout (model.safetensors.index.json and 5 bf16 shards, as
// save_pretrained wrote them) loads through the index: the logits of the bf16 weights, widened to
// fp32, are the reference's.
TEST(HfReferenceSharded, Bf16ShardsLoadThroughTheIndex) {
  const fs::path dir = fixture("llama_sharded_bf16");
  const io::SafetensorsFile ref(dir / "reference.safetensors");
  const io::SafetensorsFile weights = open_weights(dir);
  EXPECT_TRUE(weights.sharded());
  EXPECT_GT(weights.shard_paths().size(), 1u);
  const Shape shape = ref.shape("input_ids");
  const int B = static_cast<int>(shape[0]), T = static_cast<int>(shape[1]);
  nn::GPTConfig c = from_hf_config(io::read_hf_config(dir / "config.json"), 0.0f);
  c.block_size = T;
  Allocator alloc("sharded");
  nn::GPT model(c, B, alloc);
  load_weights(model, weights);
  const std::vector<int32_t> tokens = ints(ref, "input_ids");
  nn::StepContext ctx;
  ctx.training = false;
  model.forward(nn::Batch{tokens.data(), nullptr, B, T, 0}, ctx);
  expect_close(model.logits(), floats(ref, "logits"), 1e-5, "logits");
  // A missing shard is an error naming it, before any weight is read.
  const fs::path broken = fs::temp_directory_path() / "tessera_sharded_missing";
  fs::remove_all(broken);
  fs::copy(dir, broken);
  fs::remove(broken / weights.shard_paths().back().filename());
  try {
    open_weights(broken);
    ADD_FAILURE() << "a missing shard was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(weights.shard_paths().back().filename().string()),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(broken);
}

// --export-shard-mb: the saved weights in Hugging Face's shards, the same tensors as the
// checkpoint's single file, and --init-from reads them back.
TEST(HfExport, ShardedExportHoldsTheCheckpointsWeights) {
  const fs::path dir = testing::temp_dir("sharded_export");
  TrainConfig c = testing::tiny_config(dir);
  c.arch = nn::Arch::Llama;
  c.tie_embeddings = false;
  c.steps = 2;
  c.val_fraction = 0;
  c.export_shard_mb = 0.01;  // ~10 KB shards: several
  c.save = (dir / "run").string();
  run_training(c, nullptr);
  ASSERT_TRUE(fs::exists(dir / "run" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "run" / "model.safetensors"));
  const io::SafetensorsFile exported = open_weights(dir / "run");
  EXPECT_GT(exported.shard_paths().size(), 2u);
  const io::SafetensorsFile ckpt(dir / "run" / "step-00000002" / "model.safetensors");
  ASSERT_EQ(exported.names(), ckpt.names());
  for (const std::string& n : ckpt.names()) EXPECT_EQ(floats(exported, n), floats(ckpt, n)) << n;
  TrainConfig again = testing::tiny_config(dir);
  again.init_from = (dir / "run").string();
  again.steps = 1;
  again.val_fraction = 0;
  EXPECT_EQ(run_training(again, nullptr).losses.size(), 1u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::train
