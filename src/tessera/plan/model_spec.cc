#include "tessera/plan/model_spec.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/io/hf_config.h"
#include "tessera/nn/gpt_costs.h"

namespace tessera::plan {

int64_t ModelSpec::total_params() const {
  return nn::total_params(to_gpt_config(*this));
}

double ModelSpec::model_flops_per_token() const {
  return nn::model_flops_per_token(to_gpt_config(*this), seq);
}

void validate(const ModelSpec& m) {
  TESSERA_CHECK_AS(ConfigError, m.layers > 0, "the model needs at least one layer (--layers), got ",
                   m.layers);
  TESSERA_CHECK_AS(ConfigError, m.hidden > 0 && m.heads > 0 && m.hidden % m.heads == 0, "--heads (",
                   m.heads, ") must be positive and divide --dim (", m.hidden, ")");
  TESSERA_CHECK_AS(ConfigError, m.seq > 0 && m.vocab > 0, "--seq and --vocab must be positive");
  TESSERA_CHECK_AS(ConfigError, m.context == 0 || m.context >= m.seq, "the context (", m.context,
                   ") must be at least --seq (", m.seq, ")");
  TESSERA_CHECK_AS(ConfigError, m.dropout >= 0 && m.dropout < 1, "dropout must be in [0, 1), got ",
                   m.dropout);
  if (m.arch == nn::Arch::Llama) nn::validate(to_gpt_config(m));  // key/value heads, ffn_dim
  const MoeSpec& e = m.moe;
  TESSERA_CHECK_AS(ConfigError, e.experts >= 0, "--moe-experts must be >= 0, got ", e.experts);
  if (!e.enabled()) return;
  TESSERA_CHECK_AS(ConfigError, e.top_k >= 1 && e.top_k <= e.experts, "--moe-top-k ", e.top_k,
                   " must be between 1 and --moe-experts (", e.experts, ")");
  TESSERA_CHECK_AS(ConfigError, e.every >= 1 && e.every <= m.layers, "--moe-every ", e.every,
                   " must be between 1 and the number of layers (", m.layers, ")");
  TESSERA_CHECK_AS(ConfigError, e.capacity_factor >= 0 && std::isfinite(e.capacity_factor),
                   "--moe-capacity-factor must be >= 0 (0 = dropless), got ", e.capacity_factor);
}

int64_t ModelSpec::ffn() const {
  return to_gpt_config(*this).mlp_hidden();
}

int64_t ModelSpec::qkv() const {
  const nn::GPTConfig c = to_gpt_config(*this);
  return static_cast<int64_t>(c.n_head + 2 * c.kv_heads()) * c.head_dim();
}

nn::GPTConfig to_gpt_config(const ModelSpec& m) {
  nn::GPTConfig c;
  c.arch = m.arch;
  if (m.arch == nn::Arch::Llama) {
    c.n_kv_head = m.kv_heads;
    c.ffn_dim = m.ffn_dim;
    c.tie_embeddings = m.tie_embeddings;
    c.qkv_bias = m.qkv_bias;
  }
  c.n_layer = m.layers;
  c.n_head = m.heads;
  c.n_embd = m.hidden;
  c.block_size = m.block_size();
  c.vocab_size = m.vocab;
  c.dropout = static_cast<float>(m.dropout);
  c.moe.experts = m.moe.experts;
  c.moe.top_k = m.moe.top_k;
  c.moe.every = m.moe.every;
  c.moe.capacity_factor = static_cast<float>(m.moe.capacity_factor);
  if (m.arch == nn::Arch::Llama) {
    c.moe.ffn_dim = m.moe.ffn_dim;
    c.moe.shared_ffn_dim = m.moe.shared_ffn_dim;
    c.moe.shared_gate = m.moe.shared_gate;
  }
  return c;
}

nlohmann::json to_json(const ModelSpec& m) {
  nlohmann::json j = {{"layers", m.layers},  {"hidden", m.hidden}, {"heads", m.heads},
                      {"seq", m.seq},        {"vocab", m.vocab},   {"context", m.block_size()},
                      {"dropout", m.dropout}};
  if (m.arch == nn::Arch::Llama) {
    j["arch"] = "llama";
    j["kv_heads"] = m.kv_heads > 0 ? m.kv_heads : m.heads;
    j["ffn_dim"] = m.ffn();
    j["tie_embeddings"] = m.tie_embeddings;
    j["qkv_bias"] = m.qkv_bias;
  }
  if (m.moe.enabled())
    j["moe"] = {{"experts", m.moe.experts},
                {"top_k", m.moe.top_k},
                {"every", m.moe.every},
                {"capacity_factor", m.moe.capacity_factor}};
  if (m.moe.enabled() && m.arch == nn::Arch::Llama) {
    j["moe"]["ffn_dim"] = m.moe.ffn_dim;
    j["moe"]["shared_ffn_dim"] = m.moe.shared_ffn_dim;
    j["moe"]["shared_gate"] = m.moe.shared_gate;
  }
  return j;
}

namespace {

int int_field(const nlohmann::json& j, const char* key, const std::string& source) {
  const nlohmann::json& v = j.at(key);
  TESSERA_CHECK_AS(ConfigError, v.is_number_integer(), source, ": '", key,
                   "' must be an integer, got ", v.dump());
  return v.get<int>();
}

double number_field(const nlohmann::json& j, const char* key, const std::string& source) {
  const nlohmann::json& v = j.at(key);
  TESSERA_CHECK_AS(ConfigError, v.is_number(), source, ": '", key, "' must be a number, got ",
                   v.dump());
  return v.get<double>();
}

// Keys of a Hugging Face config.json that do not describe sizes (ignored).
bool hf_ignored(const std::string& k) {
  for (const char* ignored : {"model_type",
                              "architectures",
                              "activation_function",
                              "layer_norm_epsilon",
                              "n_ctx",
                              "n_inner",
                              "resid_pdrop",
                              "embd_pdrop",
                              "attn_pdrop",
                              "initializer_range",
                              "bos_token_id",
                              "eos_token_id",
                              "torch_dtype",
                              "transformers_version",
                              "use_cache",
                              "summary_type",
                              "summary_use_proj",
                              "summary_activation",
                              "summary_proj_to_labels",
                              "summary_first_dropout",
                              "scale_attn_weights",
                              "reorder_and_upcast_attn",
                              "scale_attn_by_inverse_layer_idx",
                              "task_specific_params",
                              "tokenizer_class"})
    if (k == ignored) return true;
  return false;
}

// A Llama-family config.json, as `tessera train --model` reads it (io/hf_config.h).
ModelSpec llama_family_from_json(const nlohmann::json& j, const std::string& source) {
  nlohmann::json hf = j;
  hf.erase("seq");
  const io::HfGptConfig h = io::parse_llama_family_config(hf, source);
  ModelSpec m;
  m.arch = nn::Arch::Llama;
  m.layers = h.n_layer;
  m.hidden = h.n_embd;
  m.heads = h.n_head;
  m.kv_heads = h.num_key_value_heads;
  m.ffn_dim = h.intermediate_size;
  m.vocab = h.vocab_size;
  m.tie_embeddings = h.tie_word_embeddings;
  m.qkv_bias = h.attention_bias;
  m.dropout = h.attention_dropout;
  m.seq = j.contains("seq") ? int_field(j, "seq", source) : h.n_positions;
  if (h.num_local_experts > 0) {  // Mixtral, Qwen2-MoE (mlp_only_layers not modelled: MoE)
    m.moe.experts = h.num_local_experts;
    m.moe.top_k = h.num_experts_per_tok;
    m.moe.every = h.moe_every;
    m.moe.ffn_dim = h.moe_intermediate_size;
    m.moe.shared_ffn_dim = h.shared_expert_intermediate_size;
    m.moe.shared_gate = h.shared_expert_gate;
  }
  validate(m);
  return m;
}

}  // namespace

ModelSpec model_from_json(const nlohmann::json& j, const std::string& source) {
  TESSERA_CHECK_AS(ConfigError, j.is_object(), source,
                   ": a model description must be a JSON object");
  if (j.contains("model_type") && j["model_type"].is_string() && j["model_type"] != "gpt2")
    return llama_family_from_json(j, source);
  ModelSpec m;
  const bool hf = j.contains("n_layer") || j.contains("n_embd");
  for (const auto& [k, v] : j.items()) {
    (void)v;
    if (hf) {
      if (k == "n_layer")
        m.layers = int_field(j, "n_layer", source);
      else if (k == "n_embd")
        m.hidden = int_field(j, "n_embd", source);
      else if (k == "n_head")
        m.heads = int_field(j, "n_head", source);
      else if (k == "n_positions")
        m.context = int_field(j, "n_positions", source);
      else if (k == "vocab_size")
        m.vocab = int_field(j, "vocab_size", source);
      else if (k == "seq")
        m.seq = int_field(j, "seq", source);
      else
        TESSERA_CHECK_AS(ConfigError, hf_ignored(k), source, ": unknown key '", k, "'");
      continue;
    }
    if (k == "layers")
      m.layers = int_field(j, "layers", source);
    else if (k == "hidden")
      m.hidden = int_field(j, "hidden", source);
    else if (k == "heads")
      m.heads = int_field(j, "heads", source);
    else if (k == "seq")
      m.seq = int_field(j, "seq", source);
    else if (k == "vocab")
      m.vocab = int_field(j, "vocab", source);
    else if (k == "context")
      m.context = int_field(j, "context", source);
    else if (k == "dropout")
      m.dropout = number_field(j, "dropout", source);
    else if (k == "arch")
      m.arch =
          nn::parse_arch(j["arch"].is_string() ? j["arch"].get<std::string>() : j["arch"].dump());
    else if (k == "kv_heads")
      m.kv_heads = int_field(j, "kv_heads", source);
    else if (k == "ffn_dim")
      m.ffn_dim = int_field(j, "ffn_dim", source);
    else if (k == "tie_embeddings" || k == "qkv_bias") {
      TESSERA_CHECK_AS(ConfigError, v.is_boolean(), source, ": '", k, "' must be true or false");
      (k == "tie_embeddings" ? m.tie_embeddings : m.qkv_bias) = v.get<bool>();
    } else if (k == "moe") {
      TESSERA_CHECK_AS(ConfigError, v.is_object(), source, ": 'moe' must be an object");
      for (const auto& [mk, mv] : v.items()) {
        (void)mv;
        if (mk == "experts")
          m.moe.experts = int_field(v, "experts", source);
        else if (mk == "top_k")
          m.moe.top_k = int_field(v, "top_k", source);
        else if (mk == "every")
          m.moe.every = int_field(v, "every", source);
        else if (mk == "capacity_factor")
          m.moe.capacity_factor = number_field(v, "capacity_factor", source);
        else if (mk == "ffn_dim")
          m.moe.ffn_dim = int_field(v, "ffn_dim", source);
        else if (mk == "shared_ffn_dim")
          m.moe.shared_ffn_dim = int_field(v, "shared_ffn_dim", source);
        else if (mk == "shared_gate") {
          TESSERA_CHECK_AS(ConfigError, mv.is_boolean(), source,
                           ": 'moe.shared_gate' must be true or false");
          m.moe.shared_gate = mv.get<bool>();
        } else
          TESSERA_CHECK_AS(ConfigError, false, source, ": unknown key 'moe.", mk, "'");
      }
    } else {
      TESSERA_CHECK_AS(ConfigError, false, source, ": unknown key '", k,
                       "' (a model has layers, hidden, heads, seq, vocab, context, dropout, moe, "
                       "and for the Llama family arch, kv_heads, ffn_dim, tie_embeddings, "
                       "qkv_bias)");
    }
  }
  if (hf && !j.contains("seq")) m.seq = m.context;
  if (m.context == m.seq) m.context = 0;
  validate(m);
  return m;
}

std::string describe(const ModelSpec& m) {
  char buf[256];
  const double n = static_cast<double>(m.total_params());
  std::snprintf(buf, sizeof buf, "%s L=%d C=%d heads=%d s=%d V=%d, %.4g%s parameters",
                m.arch == nn::Arch::Llama ? "Llama" : "GPT", m.layers, m.hidden, m.heads, m.seq,
                m.vocab, n >= 1e9 ? n / 1e9 : n / 1e6, n >= 1e9 ? "B" : "M");
  std::string s = buf;
  if (m.arch == nn::Arch::Llama) {
    std::snprintf(buf, sizeof buf, ", kv heads %d, ffn %lld%s",
                  m.kv_heads > 0 ? m.kv_heads : m.heads, static_cast<long long>(m.ffn()),
                  m.tie_embeddings ? ", tied" : ", untied");
    s += buf;
  }
  if (m.moe.enabled()) {
    std::snprintf(buf, sizeof buf, ", MoE %d experts top-%d every %d", m.moe.experts, m.moe.top_k,
                  m.moe.every);
    s += buf;
  }
  return s;
}

}  // namespace tessera::plan
