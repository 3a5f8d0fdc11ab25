// The planner's description of the Llama family: a Hugging Face config.json (as transformers 5
// writes one, rope_parameters included) read into a ModelSpec whose parameter count is the one a
// built model holds, element for element; and its bad configurations refused before planning.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/nn/gpt.h"
#include "tessera/plan/model_spec.h"

namespace tessera::plan {
namespace {

nlohmann::json llama3_like() {
  return nlohmann::json::parse(R"({
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 96,
    "intermediate_size": 160, "num_hidden_layers": 3, "num_attention_heads": 6,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "vocab_size": 300,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "hidden_act": "silu",
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16}})");
}

int64_t built_params(const ModelSpec& m) {
  Allocator alloc("count", 0, Backing::AddressSpaceOnly);
  nn::GPT model(to_gpt_config(m), 1, alloc);
  int64_t n = 0;
  for (nn::ParamGroup g : {nn::ParamGroup::Model, nn::ParamGroup::Experts})
    for (const nn::ParamInfo& p : model.params(g).infos()) n += p.global_numel();
  return n;
}

TEST(LlamaModelSpec, HuggingFaceConfigGivesTheBuiltModelsParameters) {
  ModelSpec m = model_from_json(llama3_like(), "config.json");
  EXPECT_EQ(m.arch, nn::Arch::Llama);
  EXPECT_EQ(m.kv_heads, 2);
  EXPECT_EQ(m.ffn(), 160);
  EXPECT_EQ(m.qkv(), (6 + 2 * 2) * 16);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(m.seq, 64);  // max_position_embeddings unless "seq" says otherwise
  EXPECT_EQ(m.total_params(), built_params(m));
  // 96 x (96 + 2 x 32) + 96 x 96 + 3 x 96 x 160 + 2 x 96 per block; embed + lm_head + norm.
  EXPECT_EQ(m.total_params(), 3 * (96 * 160 + 96 * 96 + 3 * 96 * 160 + 2 * 96) + 2 * 300 * 96 + 96);
  nlohmann::json j = llama3_like();
  j["tie_word_embeddings"] = true;
  j["model_type"] = "qwen2";  // q/k/v biases
  j["seq"] = 32;
  m = model_from_json(j, "config.json");
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_EQ(m.seq, 32);
  EXPECT_EQ(m.total_params(), built_params(m));
  // The planner's own JSON round-trips.
  EXPECT_EQ(model_from_json(to_json(m), "plan.json"), m);
}

// Mixtral and Qwen2-MoE config.json (the fixtures of tests/fixtures/hf): fine-grained experts of
// their own width, Qwen2-MoE's shared expert and its gate, counted as the built model holds them.
TEST(LlamaModelSpec, MixturesOfExpertsFromHuggingFaceConfigs) {
  for (const char* family : {"mixtral", "qwen2_moe"}) {
    std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/hf/" + family +
                     "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["seq"] = 16;
    const ModelSpec m = model_from_json(j, family);
    EXPECT_GT(m.moe.experts, 0) << family;
    EXPECT_GT(m.moe.ffn_dim, 0) << family;
    EXPECT_EQ(m.moe.shared_ffn_dim > 0, std::string(family) == "qwen2_moe") << family;
    EXPECT_EQ(m.total_params(), built_params(m)) << family;
    EXPECT_EQ(model_from_json(to_json(m), "plan.json"), m) << family;
  }
}

TEST(LlamaModelSpec, BadConfigurationsAreConfigErrors) {
  nlohmann::json j = llama3_like();
  j["num_key_value_heads"] = 4;  // does not divide 6
  EXPECT_THROW(model_from_json(j, "config.json"), ConfigError);
  j = llama3_like();
  j["model_type"] = "falcon";
  EXPECT_THROW(model_from_json(j, "config.json"), ConfigError);
  j = llama3_like();
  j["rope_parameters"]["rope_type"] = "yarn";
  try {
    model_from_json(j, "config.json");
    ADD_FAILURE() << "yarn accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("yarn"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::plan
