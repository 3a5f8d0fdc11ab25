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

json mixtral() {
  // As transformers 5.25's save_pretrained writes it (tests/fixtures/hf/mixtral, abridged).
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "head_dim": null,
    "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 48,
    "max_position_embeddings": 64, "model_type": "mixtral", "num_attention_heads": 4,
    "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "num_local_experts": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "sliding_window": null,
    "tie_word_embeddings": false, "vocab_size": 128})");
}

json qwen2_moe() {
  // tests/fixtures/hf/qwen2_moe_norm, abridged.
  return json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 96,
    "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 64,
    "max_window_layers": 28, "mlp_only_layers": [1], "model_type": "qwen2_moe",
    "moe_intermediate_size": 24, "norm_topk_prob": true, "num_attention_heads": 4,
    "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "output_router_logits": false, "qkv_bias": true,
    "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 48, "sliding_window": 0,
    "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 128})");
}

// Mixtral's and Qwen2-MoE's config.json: their keys in HfGptConfig's fields, written back as
// transformers reads them, and read back equal.
TEST_F(HfConfigTest, MixtralAndQwen2MoeRoundTrip) {
  const HfGptConfig m = parse_hf_config(mixtral(), "mixtral.json");
  EXPECT_EQ(m.model_type, "mixtral");
  EXPECT_EQ(m.num_local_experts, 4);
  EXPECT_EQ(m.num_experts_per_tok, 2);
  EXPECT_EQ(m.moe_intermediate_size, 48);
  EXPECT_EQ(m.intermediate_size, 48);
  EXPECT_EQ(m.moe_every, 1);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(m.shared_expert_intermediate_size, 0);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_EQ(m.router_aux_loss_coef, 0.001);
  const HfGptConfig q = parse_hf_config(qwen2_moe(), "qwen2_moe.json");
  EXPECT_EQ(q.model_type, "qwen2_moe");
  EXPECT_EQ(q.num_local_experts, 8);
  EXPECT_EQ(q.moe_intermediate_size, 24);
  EXPECT_EQ(q.intermediate_size, 96);
  EXPECT_EQ(q.shared_expert_intermediate_size, 48);
  EXPECT_TRUE(q.shared_expert_gate);
  EXPECT_TRUE(q.norm_topk_prob);
  EXPECT_EQ(q.mlp_only_layers, std::vector<int>{1});
  EXPECT_TRUE(q.attention_bias);
  EXPECT_EQ(q.sliding_window, 0);
  for (const HfGptConfig& c : {m, q}) {
    const auto path = dir_ / (c.model_type + ".json");
    write_hf_config(path, c);
    EXPECT_EQ(read_hf_config(path), c) << c.model_type;
  }
  const json jm = hf_config_to_json(m), jq = hf_config_to_json(q);
  EXPECT_EQ(jm["architectures"], json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(jm["intermediate_size"], 48);
  EXPECT_FALSE(jm.contains("num_experts"));
  EXPECT_EQ(jq["architectures"], json::array({"Qwen2MoeForCausalLM"}));
  EXPECT_EQ(jq["num_experts"], 8);
  EXPECT_EQ(jq["mlp_only_layers"], json::array({1}));
  EXPECT_EQ(jq["qkv_bias"], true);
  EXPECT_FALSE(jq.contains("shared_expert_gate"));  // Qwen2-MoE's is always there
  EXPECT_FALSE(jq.contains("scoring_func"));
  // Qwen2-MoE's defaults: no renormalisation; num_experts 0 is a dense model.
  json d = qwen2_moe();
  d.erase("norm_topk_prob");
  EXPECT_FALSE(parse_hf_config(d, "x").norm_topk_prob);
  d["num_experts"] = 0;
  EXPECT_EQ(parse_hf_config(d, "x").num_local_experts, 0);
  // Any mixture's routing rules, GPT-2's too: written when they are not the defaults.
  HfGptConfig g;
  g.num_local_experts = 4;
  g.norm_topk_prob = false;
  g.scoring_func = "sigmoid";
  write_hf_config(dir_ / "g.json", g);
  EXPECT_EQ(read_hf_config(dir_ / "g.json"), g);
  EXPECT_EQ(json::parse(testing::slurp(dir_ / "g.json"))["scoring_func"], "sigmoid");
}

TEST_F(HfConfigTest, MixtureOfExpertsErrorsNameTheKey) {
  json j = mixtral();
  j["router_jitter_noise"] = 0.01;
  expect_error<ConfigError>([&] { parse_hf_config(j, "m.json"); },
                            {"m.json", "router_jitter_noise"});
  j = mixtral();
  j["num_experts_per_tok"] = 5;
  expect_error<ConfigError>([&] { parse_hf_config(j, "m.json"); }, {"num_experts_per_tok 5"});
  j = mixtral();
  j.erase("num_local_experts");
  expect_error<ConfigError>([&] { parse_hf_config(j, "m.json"); }, {"num_local_experts"});
  j = qwen2_moe();
  j["mlp_only_layers"] = {2};
  expect_error<ConfigError>([&] { parse_hf_config(j, "q.json"); }, {"mlp_only_layers", "2"});
  j = qwen2_moe();
  j["scoring_func"] = "relu";
  expect_error<ConfigError>([&] { parse_hf_config(j, "q.json"); }, {"scoring_func", "relu"});
  j = qwen2_moe();
  j.erase("moe_intermediate_size");
  expect_error<ConfigError>([&] { parse_hf_config(j, "q.json"); }, {"moe_intermediate_size"});
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
