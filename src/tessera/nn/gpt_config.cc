#include "tessera/nn/gpt_config.h"

#include <cmath>

#include "tessera/core/error.h"

namespace tessera::nn {

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
