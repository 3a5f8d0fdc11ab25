#include "tessera/train/model_io.h"

#include <charconv>
#include <cstdlib>
#include <string>

#include "tessera/core/error.h"
#include "tessera/data/load_tokenizer.h"
#include "tessera/io/tensor_set.h"
#include "tessera/kernels/bf16.h"
#include "tessera/train/moe_bias.h"

namespace tessera::train {

namespace {
// The double a float's shortest decimal names (1e-05f -> 1e-05, not 9.99999974737875e-06), so a
// config.json shows the number that was configured.
double shortest_double(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}
}  // namespace

io::HfGptConfig to_hf_config(const nn::GPTConfig& c) {
  io::HfGptConfig h;
  h.n_layer = c.n_layer;
  h.n_head = c.n_head;
  h.n_embd = c.n_embd;
  h.n_positions = c.block_size;
  h.vocab_size = c.vocab_size;
  h.layer_norm_epsilon = shortest_double(c.ln_eps);
  h.num_local_experts = c.moe.experts;
  h.num_experts_per_tok = c.moe.top_k;
  h.moe_every = c.moe.every;
  h.moe_capacity_factor = c.moe.capacity_factor;
  h.router_aux_loss_coef = c.moe.aux_loss;
  h.router_z_loss_coef = c.moe.z_loss;
  h.norm_topk_prob = c.moe.renormalize;
  h.scoring_func = nn::to_string(c.moe.score);
  if (c.llama()) {
    h.model_type = c.hf_type();
    h.n_positions = c.max_positions > 0 ? c.max_positions : c.block_size;
    h.num_key_value_heads = c.kv_heads();
    h.intermediate_size = c.mlp_hidden();
    if (c.moe.enabled()) {
      h.moe_intermediate_size = c.moe_hidden();
      h.shared_expert_intermediate_size = c.moe.shared_ffn_dim;
      h.shared_expert_gate = c.moe.shared_gate;
      h.mlp_only_layers = c.moe.dense_layers;
      if (h.model_type == "mixtral") h.intermediate_size = h.moe_intermediate_size;
    }
    h.rope_theta = c.rope_theta;
    h.rope_factor = c.rope_scaling.factor;
    h.rope_low_freq_factor = c.rope_scaling.low_freq_factor;
    h.rope_high_freq_factor = c.rope_scaling.high_freq_factor;
    h.rope_original_max_positions = c.rope_scaling.original_max_positions;
    h.attention_bias = c.qkv_bias;
    h.tie_word_embeddings = c.tie_embeddings;
    h.sliding_window = c.sliding_window;
    h.attention_dropout = c.dropout;
  }
  return h;
}

nn::GPTConfig from_hf_config(const io::HfGptConfig& h, float dropout) {
  nn::GPTConfig c;
  c.n_layer = h.n_layer;
  c.n_head = h.n_head;
  c.n_embd = h.n_embd;
  c.block_size = h.n_positions;
  c.vocab_size = h.vocab_size;
  c.ln_eps = static_cast<float>(h.layer_norm_epsilon);
  c.dropout = dropout;
  c.moe.experts = h.num_local_experts;
  c.moe.top_k = h.num_experts_per_tok;
  c.moe.every = h.moe_every;
  c.moe.capacity_factor = static_cast<float>(h.moe_capacity_factor);
  c.moe.aux_loss = static_cast<float>(h.router_aux_loss_coef);
  c.moe.z_loss = static_cast<float>(h.router_z_loss_coef);
  c.moe.renormalize = h.norm_topk_prob;
  c.moe.score = nn::parse_router_score(h.scoring_func);
  if (h.llama_family()) {
    c.moe.ffn_dim = h.moe_intermediate_size;
    c.moe.shared_ffn_dim = h.shared_expert_intermediate_size;
    c.moe.shared_gate = h.shared_expert_gate;
    c.moe.dense_layers = h.mlp_only_layers;
    c.arch = nn::Arch::Llama;
    c.hf_model_type = h.model_type;
    c.max_positions = h.n_positions;
    c.n_kv_head = h.num_key_value_heads;
    c.ffn_dim = h.intermediate_size;
    c.rope_theta = h.rope_theta;
    c.rope_scaling = {h.rope_factor, h.rope_low_freq_factor, h.rope_high_freq_factor,
                      h.rope_original_max_positions};
    c.qkv_bias = h.attention_bias;
    c.o_bias = h.attention_bias && h.model_type == "llama";
    c.tie_embeddings = h.tie_word_embeddings;
    c.sliding_window = h.sliding_window;
  }
  return c;
}

std::filesystem::path weights_file(const std::filesystem::path& weights) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(weights)) return weights;
  const fs::path single = weights / io::kSafetensorsModelFile;
  const fs::path index = weights / io::kSafetensorsIndexFile;
  return !fs::exists(single) && fs::exists(index) ? index : single;  // transformers' order
}

io::SafetensorsFile open_weights(const std::filesystem::path& weights) {
  const std::filesystem::path file = weights_file(weights);
  TESSERA_CHECK_AS(ConfigError, std::filesystem::exists(file), "weights file '", file.string(),
                   "' does not exist");
  return io::SafetensorsFile::open_model(file);
}

io::HfGptConfig config_of_weights(const std::filesystem::path& weights, std::optional<int> heads) {
  std::filesystem::path file = weights_file(weights);
  TESSERA_CHECK_AS(ConfigError, std::filesystem::exists(file), "weights file '", file.string(),
                   "' does not exist");
  std::filesystem::path cfg_path = file.parent_path() / "config.json";
  if (std::filesystem::exists(cfg_path)) {
    io::HfGptConfig c = io::read_hf_config(cfg_path);
    if (heads) {
      TESSERA_CHECK_AS(ConfigError, *heads > 0 && c.n_embd % *heads == 0, "--heads ", *heads,
                       " does not divide the width ", c.n_embd, " of '", file.string(), "'");
      c.n_head = *heads;
    }
    return c;
  }
  const io::SafetensorsFile f = io::SafetensorsFile::open_model(file);
  io::GptShape s = io::infer_gpt_shape(f);
  TESSERA_CHECK_AS(ConfigError, heads.has_value(), "'", file.string(),
                   "' has no config.json beside it, so the number of heads is unknown: pass "
                   "--heads (it must divide the width ",
                   s.n_embd, ")");
  TESSERA_CHECK_AS(ConfigError, *heads > 0 && s.n_embd % *heads == 0, "--heads ", *heads,
                   " does not divide the width ", s.n_embd, " of '", file.string(), "'");
  io::HfGptConfig c;
  c.n_layer = s.n_layer;
  c.n_embd = s.n_embd;
  c.n_head = *heads;
  c.vocab_size = s.vocab_size;
  c.n_positions = s.n_positions;
  c.layer_norm_epsilon = 1e-5;
  return c;
}

io::NamedTensors named_weights(nn::GPT& model) {
  io::NamedTensors out;
  for (nn::ParamGroup g : {nn::ParamGroup::Model, nn::ParamGroup::Experts}) {
    nn::ParameterSet& ps = model.params(g);
    for (int i = 0; i < ps.size(); ++i) out.emplace_back(ps.infos()[i].name, ps.param(i));
  }
  return out;
}

void load_weights(nn::GPT& model, const io::SafetensorsFile& file) {
  io::TensorLoadOptions o;  // the MoE selection biases are state beside the weights
  for (const nn::MixtureOfExperts* m : model.moe_layers())
    o.ignore.push_back(m->names().score_bias);
  io::load_into(file, named_weights(model), o);
  for (nn::ParamGroup g : {nn::ParamGroup::Model, nn::ParamGroup::Experts})
    model.params(g).bf16_copies_stale();  // (the next forward converts the loaded values)
  for (const nn::MixtureOfExperts* m : model.moe_layers())
    if (file.contains(m->names().score_bias))
      m->set_score_bias(read_score_bias(file, m->names().score_bias, model.config().moe.experts));
}

void export_weights(const io::NamedTensors& weights, const nn::GPTConfig& config,
                    const std::filesystem::path& dir, DType dtype, uint64_t max_shard_bytes) {
  TESSERA_CHECK_AS(ConfigError, dtype == DType::F32 || dtype == DType::BF16,
                   "weights export as F32 or BF16, not ", dtype_name(dtype));
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"producer", "tessera"}};
  auto save = [&](const io::NamedTensors& tensors) {
    if (max_shard_bytes > 0)
      io::save_safetensors_sharded(dir, tensors, max_shard_bytes, meta);
    else
      io::save_safetensors(dir / "model.safetensors", tensors, meta);
  };
  if (dtype == DType::F32) {
    save(weights);
  } else {
    io::NamedTensors rounded;
    for (const auto& [name, t] : weights) {
      Tensor b = Tensor::empty(t.shape(), DType::BF16, MemCategory::Buffers, "export.bf16");
      kernels::f32_to_bf16(b.data<uint16_t>(), t.f32(), t.numel());
      rounded.emplace_back(name, std::move(b));
    }
    save(rounded);
  }
  io::write_hf_config(dir / "config.json", to_hf_config(config));
}

LoadedModel load_model(const std::filesystem::path& weights, int heads,
                       const std::filesystem::path& tokenizer, int max_batch,
                       const kernels::GemmMode& gemm) {
  LoadedModel m;
  std::filesystem::path file = weights_file(weights);
  io::HfGptConfig hc =
      config_of_weights(weights, heads > 0 ? std::optional<int>(heads) : std::nullopt);
  m.alloc = std::make_unique<Allocator>("rank 0");
  nn::GPTLayout layout;
  layout.gemm = gemm;
  m.model = std::make_unique<nn::GPT>(from_hf_config(hc, 0.0f), max_batch, *m.alloc, layout);
  load_weights(*m.model, open_weights(weights));
  // The one given, else a SentencePiece tokenizer.model beside the weights (load_tokenizer picks
  // it from the folder), else a tokenizer.json there.
  const std::filesystem::path folder = file.parent_path();
  std::filesystem::path tok = tokenizer;
  if (tokenizer.empty())
    tok = std::filesystem::exists(folder / "tokenizer.model") ? folder : folder / "tokenizer.json";
  if (!tokenizer.empty() || std::filesystem::exists(tok)) {
    m.tokenizer = data::load_tokenizer(tok);
    m.tokenizer_path = tok;
    TESSERA_CHECK_AS(ConfigError, m.tokenizer->vocab_size() <= hc.vocab_size, "tokenizer '",
                     tok.string(), "' has ", m.tokenizer->vocab_size(),
                     " tokens but the model only ", hc.vocab_size);
  }
  return m;
}

}  // namespace tessera::train
