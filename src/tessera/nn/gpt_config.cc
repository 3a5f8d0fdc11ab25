#include "tessera/nn/gpt_config.h"

#include <cmath>

#include "tessera/core/error.h"

namespace tessera::nn {

namespace {
// Whether Hugging Face's Mixtral expresses a Llama-family mixture of experts.
bool mixtral_expresses(const GPTConfig& c) {
  const MoeConfig& m = c.moe;
  return m.enabled() && m.shared_ffn_dim == 0 && m.every == 1 && m.dense_layers.empty() &&
         m.score == RouterScore::Softmax && m.renormalize && !c.qkv_bias && !c.o_bias;
}
}  // namespace

CpComm parse_cp_comm(const std::string& s) {
  if (s == "allgather") return CpComm::AllGather;
  if (s == "ring") return CpComm::Ring;
  if (s == "ulysses") return CpComm::Ulysses;
  throw ConfigError("unknown context-parallel communication '" + s +
                    "' (expected allgather, ring or ulysses)");
}

const char* to_string(CpComm c) {
  switch (c) {
    case CpComm::AllGather:
      return "allgather";
    case CpComm::Ring:
      return "ring";
    case CpComm::Ulysses:
      return "ulysses";
  }
  return "?";
}

void validate(const GPTConfig& c) {
  TESSERA_CHECK_AS(ConfigError, c.n_layer > 0, "n_layer must be positive, got ", c.n_layer);
  TESSERA_CHECK_AS(ConfigError, c.n_head > 0, "n_head must be positive, got ", c.n_head);
  TESSERA_CHECK_AS(ConfigError, c.n_embd > 0, "n_embd must be positive, got ", c.n_embd);
  TESSERA_CHECK_AS(ConfigError, c.n_embd % c.n_head == 0, "n_head (", c.n_head,
                   ") must divide n_embd (", c.n_embd, ")");
  TESSERA_CHECK_AS(ConfigError, c.block_size > 0, "block_size must be positive, got ",
                   c.block_size);
  TESSERA_CHECK_AS(ConfigError, c.vocab_size > 0, "vocab_size must be positive, got ",
                   c.vocab_size);
  TESSERA_CHECK_AS(ConfigError, c.ln_eps > 0.0f, "ln_eps must be positive, got ", c.ln_eps);
  TESSERA_CHECK_AS(ConfigError, c.dropout >= 0.0f && c.dropout < 1.0f,
                   "dropout must be in [0, 1), got ", c.dropout);
  if (c.llama()) {
    const int kv = c.kv_heads();
    TESSERA_CHECK_AS(ConfigError, kv > 0 && c.n_head % kv == 0, "the key/value heads (", kv,
                     ") must divide the attention heads (", c.n_head, ")");
    TESSERA_CHECK_AS(ConfigError, c.head_dim() % 2 == 0,
                     "rotary embeddings need an even head size, got ", c.head_dim(), " (n_embd ",
                     c.n_embd, " / n_head ", c.n_head, ")");
    TESSERA_CHECK_AS(ConfigError, c.ffn_dim >= 0,
                     "ffn_dim must be positive (0: Llama's rule), got ", c.ffn_dim);
    TESSERA_CHECK_AS(ConfigError, c.rope_theta > 0.0 && std::isfinite(c.rope_theta),
                     "rope_theta must be positive, got ", c.rope_theta);
    TESSERA_CHECK_AS(ConfigError, c.max_positions == 0 || c.block_size <= c.max_positions,
                     "the context of ", c.block_size, " positions exceeds the model's ",
                     c.max_positions, " (max_position_embeddings)");
    TESSERA_CHECK_AS(ConfigError, c.sliding_window == 0 || c.block_size <= c.sliding_window,
                     "sliding-window attention is not implemented: the context of ", c.block_size,
                     " positions must not exceed the window of ", c.sliding_window);
    TESSERA_CHECK_AS(ConfigError, c.moe.ffn_dim >= 0 && c.moe.shared_ffn_dim >= 0,
                     "--moe-ffn-dim and --moe-shared-ffn-dim must be >= 0, got ", c.moe.ffn_dim,
                     " and ", c.moe.shared_ffn_dim);
    TESSERA_CHECK_AS(ConfigError, !c.moe.shared_gate || c.moe.shared_ffn_dim > 0,
                     "--moe-shared-gate gates the shared expert: set --moe-shared-ffn-dim");
    TESSERA_CHECK_AS(ConfigError, c.hf_model_type != "mixtral" || mixtral_expresses(c),
                     "a Mixtral model has experts in every block, no shared expert, softmax "
                     "scores, renormalised gates and no attention biases");
  } else {
    TESSERA_CHECK_AS(ConfigError, c.n_kv_head == 0 || c.n_kv_head == c.n_head,
                     "GPT-2 has no grouped-query attention (n_kv_head ", c.n_kv_head, ")");
    TESSERA_CHECK_AS(ConfigError, c.tie_embeddings && !c.qkv_bias && !c.o_bias && c.ffn_dim == 0,
                     "untied heads, q/k/v or output biases and ffn_dim are for the Llama family");
    TESSERA_CHECK_AS(ConfigError,
                     c.moe.ffn_dim == 0 && c.moe.shared_ffn_dim == 0 && !c.moe.shared_gate,
                     "GPT-2's experts are MLPs of 4C: --moe-ffn-dim, --moe-shared-ffn-dim and "
                     "--moe-shared-gate are for the Llama family (--arch llama)");
  }
  const MoeConfig& m = c.moe;
  TESSERA_CHECK_AS(ConfigError, m.experts >= 0, "--moe-experts must be >= 0 (0 = dense), got ",
                   m.experts);
  if (m.experts == 0) return;
  TESSERA_CHECK_AS(ConfigError, m.top_k >= 1 && m.top_k <= m.experts, "--moe-top-k ", m.top_k,
                   " must be between 1 and the number of experts (--moe-experts ", m.experts, ")");
  TESSERA_CHECK_AS(ConfigError, m.every >= 1 && m.every <= c.n_layer, "--moe-every ", m.every,
                   " must be between 1 and the number of layers (", c.n_layer,
                   "); block l is MoE when l % every == every - 1");
  TESSERA_CHECK_AS(ConfigError, m.capacity_factor >= 0.0f && std::isfinite(m.capacity_factor),
                   "--moe-capacity-factor must be >= 0 (0 = dropless), got ", m.capacity_factor);
  TESSERA_CHECK_AS(ConfigError, m.aux_loss >= 0.0f && m.z_loss >= 0.0f,
                   "--moe-aux-loss and --moe-z-loss must be >= 0, got ", m.aux_loss, " and ",
                   m.z_loss);
  for (int l : m.dense_layers)
    TESSERA_CHECK_AS(ConfigError, l >= 0 && l < c.n_layer, "dense layer ", l,
                     " (mlp_only_layers) is not a block of the ", c.n_layer, "-layer model");
}

bool MoeConfig::is_moe_layer(int layer) const {
  if (experts <= 0 || layer % every != every - 1) return false;
  for (int l : dense_layers)
    if (l == layer) return false;
  return true;
}

const char* to_string(RouterScore s) {
  return s == RouterScore::Sigmoid ? "sigmoid" : "softmax";
}

RouterScore parse_router_score(const std::string& s) {
  if (s == "softmax") return RouterScore::Softmax;
  if (s == "sigmoid") return RouterScore::Sigmoid;
  throw ConfigError(detail::concat("--moe-router must be softmax or sigmoid, got '", s, "'"));
}

std::string llama_moe_type(const GPTConfig& c) {
  if (c.hf_model_type == "mixtral" || c.hf_model_type == "qwen2_moe") return c.hf_model_type;
  return mixtral_expresses(c) ? "mixtral" : "qwen2_moe";
}

std::string GPTConfig::hf_type() const {
  if (!llama()) return "gpt2";
  if (moe.enabled()) return llama_moe_type(*this);
  if (!hf_model_type.empty()) return hf_model_type;
  // Llama's attention_bias puts a bias on q, k, v and o; biases on q, k and v alone are Qwen2's.
  return qkv_bias && !o_bias ? "qwen2" : "llama";
}

int GPTConfig::moe_hidden() const {
  if (!llama()) return 4 * n_embd;
  return moe.ffn_dim > 0 ? moe.ffn_dim : mlp_hidden();
}

const char* to_string(Arch a) {
  return a == Arch::Llama ? "llama" : "gpt2";
}

Arch parse_arch(const std::string& s) {
  if (s == "gpt2") return Arch::Gpt2;
  if (s == "llama") return Arch::Llama;
  throw ConfigError(detail::concat("--arch must be gpt2 or llama, got '", s, "'"));
}

int llama_ffn_dim(int C) {
  const int64_t hidden = (2 * 4 * static_cast<int64_t>(C)) / 3;
  return static_cast<int>((hidden + 255) / 256 * 256);
}

int GPTConfig::mlp_hidden() const {
  if (!llama()) return 4 * n_embd;
  return ffn_dim > 0 ? ffn_dim : llama_ffn_dim(n_embd);
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  throw ConfigError(detail::concat("--recompute must be none, selective or full, got '", s, "'"));
}

WeightCopies parse_weight_copies(const std::string& s) {
  if (s == "auto") return WeightCopies::Auto;
  if (s == "on") return WeightCopies::Always;
  if (s == "off") return WeightCopies::Never;
  throw ConfigError(detail::concat("--bf16-weight-copies must be auto, on or off, got '", s, "'"));
}

bool keeps_weight_copies(WeightCopies w, bool onednn) {
  return w == WeightCopies::Always || (w == WeightCopies::Auto && onednn);
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

}  // namespace tessera::nn
