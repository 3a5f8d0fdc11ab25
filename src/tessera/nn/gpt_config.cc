#include "tessera/nn/gpt_config.h"

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
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  throw ConfigError(detail::concat("--recompute must be none, selective or full, got '", s, "'"));
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
