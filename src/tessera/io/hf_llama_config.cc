// config.json of the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, and the
// mixtures of experts MixtralForCausalLM and Qwen2MoeForCausalLM): the keys Hugging Face
// transformers reads and writes, in the fields of HfGptConfig.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/io/hf_config.h"

namespace tessera::io {
namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  const std::string& source;

  int positive(const char* key) const {
    TESSERA_CHECK_AS(ConfigError, j.contains(key), "the ", j["model_type"].get<std::string>(),
                     " config ", source, " has no \"", key, "\" field");
    const json& v = j.at(key);
    const bool ok = v.is_number_integer() && v.get<int64_t>() > 0 &&
                    v.get<int64_t>() <= std::numeric_limits<int>::max();
    TESSERA_CHECK_AS(ConfigError, ok, "in ", source, ", \"", key,
                     "\" must be a positive integer, got ", v.dump());
    return static_cast<int>(v.get<int64_t>());
  }
  double number(const json& obj, const char* key, double fallback, bool positive_only) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    const json& v = obj[key];
    const bool ok = v.is_number() && std::isfinite(v.get<double>()) &&
                    (positive_only ? v.get<double>() > 0 : v.get<double>() >= 0);
    TESSERA_CHECK_AS(ConfigError, ok, "in ", source, ", \"", key, "\" must be a ",
                     positive_only ? "positive" : "non-negative", " number, got ", v.dump());
    return v.get<double>();
  }
  int non_negative(const char* key, int fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    const json& v = j.at(key);
    const bool ok = v.is_number_integer() && v.get<int64_t>() >= 0 &&
                    v.get<int64_t>() <= std::numeric_limits<int>::max();
    TESSERA_CHECK_AS(ConfigError, ok, "in ", source, ", \"", key,
                     "\" must be a non-negative integer, got ", v.dump());
    return static_cast<int>(v.get<int64_t>());
  }
  bool flag(const char* key, bool fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    TESSERA_CHECK_AS(ConfigError, j[key].is_boolean(), "in ", source, ", \"", key,
                     "\" must be true or false, got ", j[key].dump());
    return j[key].get<bool>();
  }
  void refuse(bool bad, const char* key, const std::string& what) const {
    TESSERA_CHECK_AS(ConfigError, !bad, "in ", source, ", \"", key, "\" is ", j[key].dump(), ": ",
                     what);
  }
};

// rope_scaling (transformers 4) or rope_parameters (transformers 5).
void read_rope(const Reader& r, HfGptConfig& c) {
  const json& j = r.j;
  c.rope_theta = r.number(j, "rope_theta", c.rope_theta, true);
  const char* key = j.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!j.contains(key) || j[key].is_null()) return;
  const json& p = j[key];
  TESSERA_CHECK_AS(ConfigError, p.is_object(), "in ", r.source, ", \"", key,
                   "\" must be an object, got ", p.dump());
  c.rope_theta = r.number(p, "rope_theta", c.rope_theta, true);
  const json type = p.contains("rope_type") ? p["rope_type"] : p.value("type", json("default"));
  TESSERA_CHECK_AS(ConfigError, type == "default" || type == "llama3", "in ", r.source, ", \"", key,
                   "\" has rope_type ", type.dump(),
                   "; tessera builds the default rotary embeddings and Llama 3's scaling (llama3)");
  if (type != "llama3") return;
  c.rope_factor = r.number(p, "factor", 0.0, true);
  TESSERA_CHECK_AS(ConfigError, c.rope_factor > 0, "in ", r.source,
                   ", llama3 rope scaling needs a "
                   "positive \"factor\"");
  c.rope_low_freq_factor = r.number(p, "low_freq_factor", 1.0, true);
  c.rope_high_freq_factor = r.number(p, "high_freq_factor", 4.0, true);
  c.rope_original_max_positions = r.number(p, "original_max_position_embeddings", 8192.0, true);
}

// Mixtral's and Qwen2-MoE's experts.
void read_experts(const Reader& r, HfGptConfig& c) {
  const json& j = r.j;
  const bool mixtral = c.model_type == "mixtral";
  if (mixtral) {
    c.num_local_experts = r.positive("num_local_experts");
    c.num_experts_per_tok =
        j.contains("num_experts_per_tok") ? r.positive("num_experts_per_tok") : 2;
    c.moe_intermediate_size = c.intermediate_size;  // the experts' width; no dense blocks
    c.moe_every = 1;
    c.norm_topk_prob = true;
    c.shared_expert_gate = false;
    const double jitter = r.number(j, "router_jitter_noise", 0.0, false);
    r.refuse(jitter > 0, "router_jitter_noise",
             "tessera's router takes its input as it is (no multiplicative jitter)");
  } else {
    c.num_local_experts = r.non_negative("num_experts", 0);
    if (c.num_local_experts == 0) return;  // every block dense
    c.num_experts_per_tok =
        j.contains("num_experts_per_tok") ? r.positive("num_experts_per_tok") : 4;
    c.moe_intermediate_size = r.positive("moe_intermediate_size");
    c.shared_expert_intermediate_size = r.non_negative("shared_expert_intermediate_size", 0);
    c.shared_expert_gate =
        c.shared_expert_intermediate_size > 0 && r.flag("shared_expert_gate", true);
    c.norm_topk_prob = r.flag("norm_topk_prob", false);
    c.moe_every = j.contains("decoder_sparse_step") ? r.positive("decoder_sparse_step") : 1;
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      const json& l = j["mlp_only_layers"];
      TESSERA_CHECK_AS(ConfigError, l.is_array(), "in ", r.source,
                       ", \"mlp_only_layers\" must be a list of layer indices, got ", l.dump());
      for (const json& v : l) {
        TESSERA_CHECK_AS(
            ConfigError,
            v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.n_layer, "in ",
            r.source, ", \"mlp_only_layers\" holds ", v.dump(), ", which is not a layer of the ",
            c.n_layer, "-layer model");
        c.mlp_only_layers.push_back(v.get<int>());
      }
    }
  }
  TESSERA_CHECK_AS(ConfigError, c.num_experts_per_tok <= c.num_local_experts, "in ", r.source,
                   ", num_experts_per_tok ", c.num_experts_per_tok, " exceeds the ",
                   c.num_local_experts, " experts");
  TESSERA_CHECK_AS(ConfigError, c.moe_every <= c.n_layer, "in ", r.source, ", decoder_sparse_step ",
                   c.moe_every, " exceeds num_hidden_layers ", c.n_layer);
  c.router_aux_loss_coef = r.number(j, "router_aux_loss_coef", 0.001, false);
  c.router_z_loss_coef = r.number(j, "router_z_loss_coef", c.router_z_loss_coef, false);
  c.moe_capacity_factor = r.number(j, "moe_capacity_factor", 0.0, false);
  read_routing(j, r.source, c);
  if (mixtral)
    r.refuse(!c.norm_topk_prob || c.scoring_func != "softmax", "scoring_func",
             "Mixtral's router renormalises softmax scores");
}

}  // namespace

HfGptConfig parse_llama_family_config(const json& j, const std::string& source) {
  const Reader r{j, source};
  HfGptConfig c;
  const json type = j.value("model_type", json(nullptr));
  TESSERA_CHECK_AS(ConfigError,
                   type == "llama" || type == "mistral" || type == "qwen2" || type == "mixtral" ||
                       type == "qwen2_moe",
                   "in ", source, ", \"model_type\" is ", type.dump(),
                   "; the Llama family is llama, mistral, qwen2, mixtral and qwen2_moe");
  c.model_type = type.get<std::string>();
  c.n_layer = r.positive("num_hidden_layers");
  c.n_head = r.positive("num_attention_heads");
  c.n_embd = r.positive("hidden_size");
  c.vocab_size = r.positive("vocab_size");
  c.n_positions = r.positive("max_position_embeddings");
  c.intermediate_size = r.positive("intermediate_size");
  c.num_key_value_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                              ? r.positive("num_key_value_heads")
                              : c.n_head;
  c.layer_norm_epsilon = r.number(j, "rms_norm_eps", 1e-6, true);
  c.attention_dropout = r.number(j, "attention_dropout", 0.0, false);
  TESSERA_CHECK_AS(ConfigError, c.attention_dropout < 1.0, "in ", source,
                   ", \"attention_dropout\" must be below 1");
  read_rope(r, c);
  TESSERA_CHECK_AS(ConfigError, c.n_embd % c.n_head == 0, "in ", source, ", hidden_size ", c.n_embd,
                   " is not divisible by num_attention_heads ", c.n_head);
  TESSERA_CHECK_AS(ConfigError, c.n_head % c.num_key_value_heads == 0, "in ", source,
                   ", num_key_value_heads ", c.num_key_value_heads,
                   " does not divide num_attention_heads ", c.n_head);
  if (j.contains("head_dim") && !j["head_dim"].is_null())
    r.refuse(j["head_dim"] != c.n_embd / c.n_head, "head_dim",
             "tessera's heads are hidden_size / num_attention_heads wide");
  if (j.contains("hidden_act"))
    r.refuse(j["hidden_act"] != "silu", "hidden_act", "tessera's Llama MLP is SwiGLU (silu)");
  r.refuse(r.flag("mlp_bias", false), "mlp_bias", "MLP biases are not built");
  // Qwen2 always has q/k/v biases and no o_proj bias, Qwen2-MoE has them by qkv_bias, Mixtral
  // none; Llama's attention_bias puts one on all four.
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen2_moe";
  if (c.model_type == "qwen2_moe")
    c.attention_bias = r.flag("qkv_bias", true);
  else
    c.attention_bias =
        c.model_type == "qwen2" || (c.model_type != "mixtral" && r.flag("attention_bias", false));
  c.tie_word_embeddings = r.flag("tie_word_embeddings", false);
  if (c.model_type == "mixtral" || c.model_type == "qwen2_moe") read_experts(r, c);
  const bool window = !qwen || r.flag("use_sliding_window", false);
  if (window && j.contains("sliding_window") && !j["sliding_window"].is_null())
    c.sliding_window = r.positive("sliding_window");
  return c;
}

json llama_family_config_to_json(const HfGptConfig& c) {
  static const std::map<std::string, std::string> arch = {{"llama", "LlamaForCausalLM"},
                                                          {"mistral", "MistralForCausalLM"},
                                                          {"qwen2", "Qwen2ForCausalLM"},
                                                          {"mixtral", "MixtralForCausalLM"},
                                                          {"qwen2_moe", "Qwen2MoeForCausalLM"}};
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen2_moe";
  json j{{"model_type", c.model_type},
         {"architectures", {arch.at(c.model_type)}},
         {"num_hidden_layers", c.n_layer},
         {"num_attention_heads", c.n_head},
         {"num_key_value_heads", c.num_key_value_heads > 0 ? c.num_key_value_heads : c.n_head},
         {"hidden_size", c.n_embd},
         {"intermediate_size", c.intermediate_size},
         {"vocab_size", c.vocab_size},
         {"max_position_embeddings", c.n_positions},
         {"rms_norm_eps", c.layer_norm_epsilon},
         {"rope_theta", c.rope_theta},
         {"hidden_act", "silu"},
         {"tie_word_embeddings", c.tie_word_embeddings},
         {"attention_dropout", c.attention_dropout},
         {"torch_dtype", "float32"}};
  if (c.model_type == "llama") j["attention_bias"] = c.attention_bias;
  if (!qwen)
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  else if (c.sliding_window > 0)
    j["use_sliding_window"] = true, j["sliding_window"] = c.sliding_window;
  if (c.model_type == "mixtral") {
    j["num_local_experts"] = c.num_local_experts;
    j["intermediate_size"] = c.moe_intermediate_size;
    j["router_jitter_noise"] = 0.0;
  } else if (c.model_type == "qwen2_moe") {
    j["qkv_bias"] = c.attention_bias;
    j["use_sliding_window"] = c.sliding_window > 0;
    j["num_experts"] = c.num_local_experts;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.moe_every;
    j["mlp_only_layers"] = c.mlp_only_layers;
    if (c.shared_expert_intermediate_size > 0 && !c.shared_expert_gate)
      j["shared_expert_gate"] = false;
  }
  if (c.model_type == "mixtral" || c.model_type == "qwen2_moe") {
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = false;
    // tessera's own keys (transformers ignores them).
    j["router_z_loss_coef"] = c.router_z_loss_coef;
    if (c.moe_capacity_factor > 0) j["moe_capacity_factor"] = c.moe_capacity_factor;
    if (c.scoring_func != "softmax") j["scoring_func"] = c.scoring_func;
  }
  if (c.rope_factor > 0)
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_factor},
        {"low_freq_factor", c.rope_low_freq_factor},
        {"high_freq_factor", c.rope_high_freq_factor},
        {"original_max_position_embeddings", static_cast<int64_t>(c.rope_original_max_positions)}};
  return j;
}

}  // namespace tessera::io
