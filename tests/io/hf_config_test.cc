#include "tessera/io/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace tessera::io {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::spit;

class HfConfigTest : public testing::TempDirTest {};

json gpt2_small() {
  // As in the Hugging Face "gpt2" repository (abridged).
  return json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "vocab_size": 50257})");
}

TEST_F(HfConfigTest, ParsesHuggingFaceGpt2) {
  const HfGptConfig c = parse_hf_config(gpt2_small(), "gpt2/config.json");
  EXPECT_EQ(c, HfGptConfig{});  // the defaults are GPT-2 small
}

TEST_F(HfConfigTest, RoundTripThroughAFile) {
  HfGptConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 64;
  c.n_positions = 128;
  c.vocab_size = 1000;
  c.layer_norm_epsilon = 1e-6;
  const auto path = dir_ / "config.json";
  write_hf_config(path, c);
  EXPECT_EQ(read_hf_config(path), c);
  const json j = json::parse(testing::slurp(path));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_ctx"], 128);
}

// A mixture-of-experts model's settings round-trip; a dense model writes none of them, and a
// file with num_local_experts 0 is dense.
TEST_F(HfConfigTest, MixtureOfExpertsFieldsRoundTrip) {
  HfGptConfig c;
  c.num_local_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_every = 2;
  c.moe_capacity_factor = 1.25;
  c.router_aux_loss_coef = 0.02;
  c.router_z_loss_coef = 0.003;
  const auto path = dir_ / "moe.json";
  write_hf_config(path, c);
  EXPECT_EQ(read_hf_config(path), c);
  const json j = json::parse(testing::slurp(path));
  EXPECT_EQ(j["num_local_experts"], 8);
  EXPECT_EQ(j["moe_every"], 2);
  EXPECT_FALSE(hf_config_to_json(HfGptConfig{}).contains("num_local_experts"));
  json dense = gpt2_small();
  dense["num_local_experts"] = 0;
  EXPECT_EQ(parse_hf_config(dense, "x"), HfGptConfig{});
  json bad = gpt2_small();
  bad["num_local_experts"] = 4;
  bad["num_experts_per_tok"] = 5;
  expect_error<ConfigError>([&] { parse_hf_config(bad, "cfg.json"); },
                            {"cfg.json", "num_experts_per_tok 5 exceeds num_local_experts 4"});
  bad["num_experts_per_tok"] = 2;
  bad["moe_capacity_factor"] = -1;
  expect_error<ConfigError>([&] { parse_hf_config(bad, "cfg.json"); }, {"moe_capacity_factor"});
  bad["moe_capacity_factor"] = 1;
  bad["num_local_experts"] = -2;
  expect_error<ConfigError>([&] { parse_hf_config(bad, "cfg.json"); }, {"num_local_experts"});
}

TEST_F(HfConfigTest, NCtxAndDefaultEpsilon) {
  json j = gpt2_small();
  j.erase("n_positions");
  j.erase("layer_norm_epsilon");
  j["n_ctx"] = 256;
  const HfGptConfig c = parse_hf_config(j, "x");
  EXPECT_EQ(c.n_positions, 256);
  EXPECT_EQ(c.layer_norm_epsilon, 1e-5);
}

TEST_F(HfConfigTest, ClearErrors) {
  for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size"}) {
    json j = gpt2_small();
    j.erase(key);
    expect_error<ConfigError>([&] { parse_hf_config(j, "cfg.json"); },
                              {"cfg.json", std::string("no \"") + key + "\""});
  }
  json j = gpt2_small();
  j.erase("n_positions");
  j.erase("n_ctx");
  expect_error<ConfigError>([&] { parse_hf_config(j, "cfg.json"); }, {"n_positions", "n_ctx"});
  j = gpt2_small();
  j["n_head"] = 0;
  expect_error<ConfigError>([&] { parse_hf_config(j, "cfg.json"); }, {"\"n_head\"", "positive"});
  j["n_head"] = "12";
  expect_error<ConfigError>([&] { parse_hf_config(j, "cfg.json"); }, {"\"n_head\"", "\"12\""});
  j["n_head"] = 7;
  expect_error<ConfigError>([&] { parse_hf_config(j, "cfg.json"); }, {"not divisible"});
  j = gpt2_small();
  j["layer_norm_epsilon"] = -1;
  expect_error<ConfigError>([&] { parse_hf_config(j, "cfg.json"); }, {"layer_norm_epsilon"});
  j = gpt2_small();
  j["model_type"] = "bert";
  expect_error<ConfigError>([&] { parse_hf_config(j, "cfg.json"); }, {"\"bert\"", "qwen2"});
  j = gpt2_small();
  j["n_inner"] = 100;
  expect_error<ConfigError>([&] { parse_hf_config(j, "cfg.json"); }, {"n_inner"});
  expect_error<ConfigError>([&] { parse_hf_config(json::array(), "cfg.json"); }, {"JSON object"});

  spit(dir_ / "bad.json", "{\"n_layer\": ");
  expect_error<ConfigError>([&] { read_hf_config(dir_ / "bad.json"); },
                            {(dir_ / "bad.json").string(), "not valid JSON"});
  expect_error<IoError>([&] { read_hf_config(dir_ / "absent.json"); }, {"absent.json"});
}

TEST_F(HfConfigTest, InferShapeFromTensors) {
  HfGptConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 8;
  c.n_positions = 16;
  c.vocab_size = 20;
  NamedTensors t;
  for (const ExpectedTensor& e : gpt2_expected_tensors(c))
    t.emplace_back("transformer." + e.name, Tensor::zeros(e.shape));
  t.emplace_back("lm_head.weight", Tensor::zeros({20, 8}));
  save_safetensors(dir_ / "m.safetensors", t);
  const GptShape g = infer_gpt_shape(SafetensorsFile(dir_ / "m.safetensors"));
  EXPECT_EQ(g.n_layer, 3);
  EXPECT_EQ(g.n_embd, 8);
  EXPECT_EQ(g.vocab_size, 20);
  EXPECT_EQ(g.n_positions, 16);

  save_safetensors(dir_ / "gap.safetensors", {{"wte.weight", Tensor::zeros({20, 8})},
                                              {"wpe.weight", Tensor::zeros({16, 8})},
                                              {"h.1.ln_1.weight", Tensor::zeros({8})}});
  expect_error<IoError>([&] { infer_gpt_shape(SafetensorsFile(dir_ / "gap.safetensors")); },
                        {"gap.safetensors", "some layers are missing"});
  save_safetensors(dir_ / "nowpe.safetensors", {{"wte.weight", Tensor::zeros({20, 8})}});
  expect_error<IoError>([&] { infer_gpt_shape(SafetensorsFile(dir_ / "nowpe.safetensors")); },
                        {"nowpe.safetensors", "'wpe.weight'"});
}

}  // namespace
}  // namespace tessera::io
