#include "tessera/plan/model_spec.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
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

nn::GPTConfig to_gpt_config(const ModelSpec& m) {
  nn::GPTConfig c;
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
  return c;
}

nlohmann::json to_json(const ModelSpec& m) {
  nlohmann::json j = {{"layers", m.layers},  {"hidden", m.hidden}, {"heads", m.heads},
                      {"seq", m.seq},        {"vocab", m.vocab},   {"context", m.block_size()},
                      {"dropout", m.dropout}};
  if (m.moe.enabled())
    j["moe"] = {{"experts", m.moe.experts},
                {"top_k", m.moe.top_k},
                {"every", m.moe.every},
                {"capacity_factor", m.moe.capacity_factor}};
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

}  // namespace

ModelSpec model_from_json(const nlohmann::json& j, const std::string& source) {
  TESSERA_CHECK_AS(ConfigError, j.is_object(), source,
                   ": a model description must be a JSON object");
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
    else if (k == "moe") {
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
        else
          TESSERA_CHECK_AS(ConfigError, false, source, ": unknown key 'moe.", mk, "'");
      }
    } else {
      TESSERA_CHECK_AS(ConfigError, false, source, ": unknown key '", k,
                       "' (a model has layers, hidden, heads, seq, vocab, context, dropout, moe)");
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
  std::snprintf(buf, sizeof buf, "GPT L=%d C=%d heads=%d s=%d V=%d, %.4g%s parameters", m.layers,
                m.hidden, m.heads, m.seq, m.vocab, n >= 1e9 ? n / 1e9 : n / 1e6,
                n >= 1e9 ? "B" : "M");
  std::string s = buf;
  if (m.moe.enabled()) {
    std::snprintf(buf, sizeof buf, ", MoE %d experts top-%d every %d", m.moe.experts, m.moe.top_k,
                  m.moe.every);
    s += buf;
  }
  return s;
}

}  // namespace tessera::plan
