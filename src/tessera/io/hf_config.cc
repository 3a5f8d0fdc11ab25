#include "tessera/io/hf_config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/json_parse.h"

namespace tessera::io {
namespace {

using nlohmann::json;

int positive_int(const json& j, const char* key, const std::string& source) {
  const json& v = j.at(key);
  const bool ok = v.is_number_integer() && v.get<int64_t>() > 0 &&
                  v.get<int64_t>() <= std::numeric_limits<int>::max();
  TESSERA_CHECK_AS(ConfigError, ok, "in ", source, ", \"", key,
                   "\" must be a positive integer, got ", v.dump());
  return static_cast<int>(v.get<int64_t>());
}

int required_int(const json& j, const char* key, const std::string& source) {
  TESSERA_CHECK_AS(ConfigError, j.contains(key), "the GPT-2 config ", source, " has no \"", key,
                   "\" field");
  return positive_int(j, key, source);
}

std::string strip(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes) {
    if (name.starts_with(p)) return name.substr(p.size());
  }
  return name;
}

}  // namespace

void read_routing(const json& j, const std::string& source, HfGptConfig& c) {
  if (j.contains("norm_topk_prob") && !j["norm_topk_prob"].is_null()) {
    TESSERA_CHECK_AS(ConfigError, j["norm_topk_prob"].is_boolean(), "in ", source,
                     ", \"norm_topk_prob\" must be true or false, got ",
                     j["norm_topk_prob"].dump());
    c.norm_topk_prob = j["norm_topk_prob"].get<bool>();
  }
  if (j.contains("scoring_func") && !j["scoring_func"].is_null()) {
    const json& f = j["scoring_func"];
    TESSERA_CHECK_AS(ConfigError, f == "softmax" || f == "sigmoid", "in ", source,
                     ", \"scoring_func\" is ", f.dump(),
                     "; tessera's routers score by softmax or sigmoid");
    c.scoring_func = f.get<std::string>();
  }
}

HfGptConfig parse_hf_config(const json& j, const std::string& source) {
  TESSERA_CHECK_AS(ConfigError, j.is_object(), "the GPT-2 config ", source,
                   " must be a JSON object, but it is a JSON ", j.type_name());
  if (j.contains("model_type")) {
    const json& mt = j["model_type"];
    const std::set<std::string> llama = {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe"};
    if (mt.is_string() && llama.count(mt.get<std::string>()))
      return parse_llama_family_config(j, source);
    TESSERA_CHECK_AS(ConfigError, mt.is_string() && mt.get<std::string>() == "gpt2", "in ", source,
                     ", \"model_type\" is ", mt.dump(),
                     "; tessera reads the model types gpt2, llama, mistral, qwen2, mixtral and "
                     "qwen2_moe");
  }
  HfGptConfig c;
  c.n_layer = required_int(j, "n_layer", source);
  c.n_head = required_int(j, "n_head", source);
  c.n_embd = required_int(j, "n_embd", source);
  c.vocab_size = required_int(j, "vocab_size", source);
  if (j.contains("n_positions")) {
    c.n_positions = positive_int(j, "n_positions", source);
  } else {
    TESSERA_CHECK_AS(ConfigError, j.contains("n_ctx"), "the GPT-2 config ", source,
                     " has neither \"n_positions\" nor \"n_ctx\" (the context length)");
    c.n_positions = positive_int(j, "n_ctx", source);
  }
  if (j.contains("layer_norm_epsilon")) {
    const json& e = j["layer_norm_epsilon"];
    const bool ok = e.is_number() && std::isfinite(e.get<double>()) && e.get<double>() > 0;
    TESSERA_CHECK_AS(ConfigError, ok, "in ", source,
                     ", \"layer_norm_epsilon\" must be a positive number, got ", e.dump());
    c.layer_norm_epsilon = e.get<double>();
  }
  if (j.contains("n_inner") && !j["n_inner"].is_null()) {
    const int inner = positive_int(j, "n_inner", source);
    const int64_t mlp = 4 * static_cast<int64_t>(c.n_embd);  // n_embd may be up to INT_MAX
    TESSERA_CHECK_AS(ConfigError, inner == mlp, "in ", source, ", \"n_inner\" is ", inner,
                     "; tessera's GPT-2 MLP is 4 * n_embd = ", mlp, " wide");
  }
  TESSERA_CHECK_AS(ConfigError, c.n_embd % c.n_head == 0, "in ", source, ", n_embd ", c.n_embd,
                   " is not divisible by n_head ", c.n_head);
  if (j.contains("num_local_experts")) {
    const json& e = j["num_local_experts"];
    TESSERA_CHECK_AS(ConfigError,
                     e.is_number_integer() && e.get<int64_t>() >= 0 &&
                         e.get<int64_t>() <= std::numeric_limits<int>::max(),
                     "in ", source, ", \"num_local_experts\" must be a non-negative integer, got ",
                     e.dump());
    c.num_local_experts = static_cast<int>(e.get<int64_t>());
  }
  if (c.num_local_experts > 0) {
    if (j.contains("num_experts_per_tok"))
      c.num_experts_per_tok = positive_int(j, "num_experts_per_tok", source);
    if (j.contains("moe_every")) c.moe_every = positive_int(j, "moe_every", source);
    TESSERA_CHECK_AS(ConfigError, c.num_experts_per_tok <= c.num_local_experts, "in ", source,
                     ", num_experts_per_tok ", c.num_experts_per_tok, " exceeds num_local_experts ",
                     c.num_local_experts);
    TESSERA_CHECK_AS(ConfigError, c.moe_every <= c.n_layer, "in ", source, ", moe_every ",
                     c.moe_every, " exceeds n_layer ", c.n_layer);
    auto non_negative = [&](const char* key, double& out) {
      if (!j.contains(key)) return;
      const json& v = j[key];
      const bool ok = v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0 &&
                      v.get<double>() <= 1e30;
      TESSERA_CHECK_AS(ConfigError, ok, "in ", source, ", \"", key,
                       "\" must be a non-negative number, got ", v.dump());
      out = v.get<double>();
    };
    non_negative("moe_capacity_factor", c.moe_capacity_factor);
    non_negative("router_aux_loss_coef", c.router_aux_loss_coef);
    non_negative("router_z_loss_coef", c.router_z_loss_coef);
    read_routing(j, source, c);
  }
  return c;
}

HfGptConfig read_hf_config(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  json j;
  try {
    j = parse_json(text);
  } catch (const json::exception& e) {
    throw ConfigError(
        detail::concat("the GPT-2 config ", path.string(), " is not valid JSON (", e.what(), ")"));
  }
  return parse_hf_config(j, path.string());
}

json hf_config_to_json(const HfGptConfig& c) {
  if (c.llama_family()) return llama_family_config_to_json(c);
  json j{{"model_type", "gpt2"},
         {"architectures", {"GPT2LMHeadModel"}},
         {"n_layer", c.n_layer},
         {"n_head", c.n_head},
         {"n_embd", c.n_embd},
         {"n_positions", c.n_positions},
         {"n_ctx", c.n_positions},
         {"vocab_size", c.vocab_size},
         {"layer_norm_epsilon", c.layer_norm_epsilon},
         {"activation_function", "gelu_new"}};
  if (c.num_local_experts > 0) {
    j["num_local_experts"] = c.num_local_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_every"] = c.moe_every;
    j["moe_capacity_factor"] = c.moe_capacity_factor;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["router_z_loss_coef"] = c.router_z_loss_coef;
    if (!c.norm_topk_prob) j["norm_topk_prob"] = false;
    if (c.scoring_func != "softmax") j["scoring_func"] = c.scoring_func;
  }
  return j;
}

void write_hf_config(const std::filesystem::path& path, const HfGptConfig& c) {
  write_file_atomic(path, hf_config_to_json(c).dump(2) + "\n");
}

GptShape infer_gpt_shape(const SafetensorsFile& file,
                         const std::vector<std::string>& strip_prefixes) {
  const std::string where = file.path().string();
  std::map<std::string, std::string> names;  // stripped -> file name
  std::set<int> layers;
  for (const std::string& fname : file.names()) {
    const std::string name = strip(fname, strip_prefixes);
    names[name] = fname;
    if (name.starts_with("h.")) {
      const size_t dot = name.find('.', 2);
      const std::string idx = name.substr(2, dot == std::string::npos ? dot : dot - 2);
      const bool numeric = !idx.empty() && idx.size() < 9 &&
                           idx.find_first_not_of("0123456789") == std::string::npos;
      TESSERA_CHECK_AS(IoError, numeric, "tensor '", fname, "' in ", where,
                       " does not follow the GPT-2 naming h.<layer>.<...>");
      layers.insert(std::stoi(idx));
    }
  }
  auto shape2 = [&](const char* name) {
    auto it = names.find(name);
    TESSERA_CHECK_AS(IoError, it != names.end(), "cannot infer the GPT-2 shape of ", where,
                     ": it has no '", name, "' tensor");
    const Shape& s = file.shape(it->second);
    TESSERA_CHECK_AS(IoError, s.size() == 2 && s[0] > 0 && s[1] > 0, "tensor '", it->second,
                     "' in ", where, " has shape ", shape_str(s), "; expected two dimensions");
    return s;
  };
  const Shape wte = shape2("wte.weight");
  const Shape wpe = shape2("wpe.weight");
  TESSERA_CHECK_AS(IoError, wte[1] == wpe[1], "in ", where, ", wte.weight ", shape_str(wte),
                   " and wpe.weight ", shape_str(wpe), " disagree on the embedding width");
  GptShape g;
  g.vocab_size = static_cast<int>(wte[0]);
  g.n_embd = static_cast<int>(wte[1]);
  g.n_positions = static_cast<int>(wpe[0]);
  g.n_layer = static_cast<int>(layers.size());
  TESSERA_CHECK_AS(IoError, layers.empty() || *layers.rbegin() == g.n_layer - 1, "in ", where,
                   ", tensors of ", g.n_layer, " layer(s) are present but the highest index is h.",
                   layers.empty() ? 0 : *layers.rbegin(), "; some layers are missing");
  return g;
}

std::vector<ExpectedTensor> gpt2_expected_tensors(const HfGptConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<ExpectedTensor> e = {{"wte.weight", {c.vocab_size, C}},
                                   {"wpe.weight", {c.n_positions, C}}};
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    e.push_back({h + "ln_1.weight", {C}});
    e.push_back({h + "ln_1.bias", {C}});
    e.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
    e.push_back({h + "attn.c_attn.bias", {3 * C}});
    e.push_back({h + "attn.c_proj.weight", {C, C}});
    e.push_back({h + "attn.c_proj.bias", {C}});
    e.push_back({h + "ln_2.weight", {C}});
    e.push_back({h + "ln_2.bias", {C}});
    e.push_back({h + "mlp.c_fc.weight", {C, 4 * C}});
    e.push_back({h + "mlp.c_fc.bias", {4 * C}});
    e.push_back({h + "mlp.c_proj.weight", {4 * C, C}});
    e.push_back({h + "mlp.c_proj.bias", {C}});
  }
  e.push_back({"ln_f.weight", {C}});
  e.push_back({"ln_f.bias", {C}});
  return e;
}

}  // namespace tessera::io
