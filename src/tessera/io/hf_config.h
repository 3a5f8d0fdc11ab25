// Hugging Face config.json of GPT-2 and of the Llama family (model_type "llama", "mistral",
// "qwen2", and the mixtures of experts "mixtral" and "qwen2_moe"): read, validate, write; and the
// GPT-2 tensor names and shapes.
#pragma once

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessera/io/safetensors.h"
#include "tessera/io/tensor_set.h"

namespace tessera::io {

struct HfGptConfig {
  // "gpt2", or the Llama family's "llama" | "mistral" | "qwen2" | "mixtral" | "qwen2_moe" (read
  // from and written as their own keys: num_hidden_layers, num_attention_heads, hidden_size,
  // max_position_embeddings, rms_norm_eps into the GPT-2 names below).
  std::string model_type = "gpt2";
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int n_positions = 1024;  // "n_ctx" in older files
  int vocab_size = 50257;
  double layer_norm_epsilon = 1e-5;
  // Mixture of experts (docs/FORMATS.md), written only when num_local_experts > 0: Mixtral's
  // num_local_experts, num_experts_per_tok and router_aux_loss_coef, Switch's router_z_loss_coef,
  // and tessera's moe_every and moe_capacity_factor.
  int num_local_experts = 0;
  int num_experts_per_tok = 2;
  int moe_every = 1;
  double moe_capacity_factor = 0;
  double router_aux_loss_coef = 0.01;
  double router_z_loss_coef = 0.001;
  // Routing (any mixture): Qwen2-MoE's norm_topk_prob (Mixtral: always), and the scores,
  // "softmax" or "sigmoid" (DeepSeek-V3's key scoring_func; written only when sigmoid).
  bool norm_topk_prob = true;
  std::string scoring_func = "softmax";
  // The Llama family's mixtures of experts. mixtral: num_local_experts, intermediate_size the
  // experts' width (here both intermediate_size and moe_intermediate_size), every block MoE.
  // qwen2_moe: num_experts (num_local_experts here), moe_intermediate_size,
  // shared_expert_intermediate_size (0: none), decoder_sparse_step (moe_every), mlp_only_layers,
  // intermediate_size the dense blocks' width, and tessera's shared_expert_gate (written only when
  // false: Qwen2-MoE always gates its shared expert).
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  bool shared_expert_gate = false;
  std::vector<int> mlp_only_layers{};
  // The Llama family.
  int num_key_value_heads = 0;  // 0: n_head
  int intermediate_size = 0;
  double rope_theta = 10000.0;
  double rope_factor = 0.0;  // Llama 3 scaling (rope_type "llama3"); 0: none
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  double rope_original_max_positions = 8192.0;
  bool attention_bias = false;  // Llama: q/k/v and o biases (Qwen2: q/k/v, always)
  bool tie_word_embeddings = true;
  int sliding_window = 0;  // 0: none
  double attention_dropout = 0.0;
  bool llama_family() const { return model_type != "gpt2"; }
  bool operator==(const HfGptConfig&) const = default;
};

// Reads the fields above from a config object; `source` names it in errors (a file path).
// n_layer, n_head, n_embd, vocab_size and n_positions (or n_ctx) are required; each must be a
// positive integer and n_embd divisible by n_head. Throws ConfigError.
// A Llama-family file (model_type llama, mistral or qwen2) reads num_hidden_layers,
// num_attention_heads, num_key_value_heads, hidden_size, intermediate_size, vocab_size,
// max_position_embeddings, rms_norm_eps, rope_theta and rope_scaling (or transformers 5's
// rope_parameters: "default" or "llama3"), attention_bias, tie_word_embeddings, sliding_window,
// attention_dropout; what tessera does not build (another hidden_act, mlp_bias, a head_dim other
// than hidden_size / heads, other rope types, Mixtral's router_jitter_noise) is a ConfigError
// naming the key. mixtral and qwen2_moe add their experts' keys (above) and router_aux_loss_coef;
// qwen2_moe reads qkv_bias (default true).
HfGptConfig parse_hf_config(const nlohmann::json& j, const std::string& source);
HfGptConfig parse_llama_family_config(const nlohmann::json& j, const std::string& source);
nlohmann::json llama_family_config_to_json(const HfGptConfig& c);
// norm_topk_prob and scoring_func of any mixture, when present.
void read_routing(const nlohmann::json& j, const std::string& source, HfGptConfig& c);
HfGptConfig read_hf_config(const std::filesystem::path& path);  // IoError if unreadable

// The fields plus model_type "gpt2", architectures ["GPT2LMHeadModel"], n_ctx and
// activation_function, so Hugging Face transformers can load the directory.
nlohmann::json hf_config_to_json(const HfGptConfig& c);
void write_hf_config(const std::filesystem::path& path, const HfGptConfig& c);  // atomic

// What a GPT-2 safetensors file's shapes say (the head count cannot be inferred).
struct GptShape {
  int n_layer = 0;
  int n_embd = 0;
  int vocab_size = 0;
  int n_positions = 0;
};
GptShape infer_gpt_shape(const SafetensorsFile& file,
                         const std::vector<std::string>& strip_prefixes = {"transformer."});

// Hugging Face names and shapes of every GPT-2 parameter (no lm_head: it is tied to wte).
std::vector<ExpectedTensor> gpt2_expected_tensors(const HfGptConfig& c);

}  // namespace tessera::io
