#include "tessera/train/train_config.h"

#include <fstream>

#include "tessera/core/error.h"
#include "tessera/nn/gpt_config.h"

namespace tessera::train {

// One list of (key, member) pairs drives both directions of the JSON mapping.
// clang-format off
#define TESSERA_TRAIN_CONFIG_FIELDS(X)                                                        \
  X(data) X(vocab) X(val_fraction) X(cache_dir)                                               \
  X(layers) X(dim) X(heads) X(seq) X(dropout) X(init_from)                                    \
  X(steps) X(batch) X(micro_batch) X(lr) X(warmup) X(min_lr_ratio) X(weight_decay)           \
  X(grad_clip) X(optimizer) X(momentum) X(beta1) X(beta2) X(seed)                             \
  X(dp) X(tp) X(zero) X(bucket_mb) X(overlap) X(backend) X(trace) X(recompute)                      \
  X(threads) X(memory_limit) X(save) X(resume) X(save_every) X(metrics) X(eval_every)         \
  X(eval_batches) X(sample_tokens) X(prompt) X(temperature) X(top_k) X(log_every)
// clang-format on

nlohmann::json to_json(const TrainConfig& c) {
  nlohmann::json j;
#define X(name) j[#name] = c.name;
  TESSERA_TRAIN_CONFIG_FIELDS(X)
#undef X
  return j;
}

TrainConfig train_config_from_json(const nlohmann::json& j) {
  TESSERA_CHECK_AS(ConfigError, j.is_object(), "a training config must be a JSON object");
  TrainConfig c;
  nlohmann::json known = to_json(c);
  for (const auto& [key, value] : j.items()) {
    TESSERA_CHECK_AS(ConfigError, known.contains(key), "unknown config key '", key,
                     "'; run `tessera train --help` for the accepted keys");
    (void)value;
  }
#define X(name)                                                                           \
  if (j.contains(#name)) {                                                                \
    try {                                                                                 \
      j.at(#name).get_to(c.name);                                                         \
    } catch (const nlohmann::json::exception&) {                                          \
      throw ConfigError(detail::concat("config key '" #name "' has the wrong type: got ", \
                                       j.at(#name).dump(), ", expected something like ",  \
                                       known.at(#name).dump()));                          \
    }                                                                                     \
  }
  TESSERA_TRAIN_CONFIG_FIELDS(X)
#undef X
  return c;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK_AS(ConfigError, in.good(), "cannot open config file '", path, "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(detail::concat("config file '", path, "' is not valid JSON: ", e.what()));
  }
}

void check_tensor_parallel(int heads, int dim, int tp) {
  TESSERA_CHECK_AS(ConfigError, heads % tp == 0, "--tp ", tp, " does not divide the ", heads,
                   " attention heads; choose --tp among the divisors of the head count");
  TESSERA_CHECK_AS(ConfigError, (4 * static_cast<int64_t>(dim)) % tp == 0, "--tp ", tp,
                   " does not divide the MLP width 4 x dim = ", 4 * static_cast<int64_t>(dim),
                   "; choose --tp dividing it");
}

void TrainConfig::validate() const {
  auto positive = [](const char* key, int64_t v) {
    TESSERA_CHECK_AS(ConfigError, v > 0, "--", key, " must be positive, got ", v);
  };
  positive("layers", layers);
  positive("dim", dim);
  positive("seq", seq);
  positive("batch", batch);
  positive("eval-batches", eval_batches);
  positive("log-every", log_every);
  TESSERA_CHECK_AS(ConfigError, steps >= 0, "--steps must be >= 0, got ", steps);
  TESSERA_CHECK_AS(ConfigError, vocab >= 257 && vocab <= 65535,
                   "--vocab must be between 257 (the 256 bytes plus one merge) and 65535, got ",
                   vocab);
  TESSERA_CHECK_AS(ConfigError, heads >= 0, "--heads must be positive (or 0: automatic), got ",
                   heads);
  TESSERA_CHECK_AS(ConfigError, dim % new_model_heads() == 0, "--heads ", new_model_heads(),
                   " does not divide --dim ", dim,
                   "; choose heads so that dim/heads is a whole number");
  positive("dp", dp);
  TESSERA_CHECK_AS(ConfigError, tp >= 1,
                   "--tp must be at least 1 (1 = no tensor parallelism), got ", tp);
  if (resume.empty() && init_from.empty()) check_tensor_parallel(new_model_heads(), dim, tp);
  TESSERA_CHECK_AS(ConfigError, batch % dp == 0, "--batch ", batch, " does not split over --dp ",
                   dp, " ranks; choose a batch that is a multiple of dp");
  TESSERA_CHECK_AS(ConfigError,
                   micro_batch >= 0 && (micro_batch == 0 || (batch / dp) % micro_batch == 0),
                   "--micro-batch ", micro_batch, " must divide the per-rank batch ", batch / dp,
                   " (--batch ", batch, " / --dp ", dp, ")");
  TESSERA_CHECK_AS(ConfigError, zero >= 0 && zero <= 3, "--zero must be 0, 1, 2 or 3, got ", zero);
  nn::parse_recompute(recompute);  // throws a ConfigError naming the accepted values
  TESSERA_CHECK_AS(ConfigError, bucket_mb > 0, "--bucket-mb must be positive, got ", bucket_mb);
  TESSERA_CHECK_AS(ConfigError, backend == "auto" || backend == "inproc" || backend == "mpi",
                   "--backend must be auto, inproc or mpi, got '", backend, "'");
  TESSERA_CHECK_AS(ConfigError, val_fraction >= 0 && val_fraction < 1,
                   "--val-fraction must be in [0, 1), got ", val_fraction);
  TESSERA_CHECK_AS(ConfigError, dropout >= 0 && dropout < 1, "--dropout must be in [0, 1), got ",
                   dropout);
  TESSERA_CHECK_AS(ConfigError, lr > 0, "--lr must be positive, got ", lr);
  TESSERA_CHECK_AS(ConfigError, warmup >= 0, "--warmup must be >= 0, got ", warmup);
  TESSERA_CHECK_AS(ConfigError, weight_decay >= 0, "--weight-decay must be >= 0");
  TESSERA_CHECK_AS(ConfigError, grad_clip >= 0, "--grad-clip must be >= 0 (0 disables)");
  TESSERA_CHECK_AS(ConfigError, optimizer == "adamw" || optimizer == "sgd",
                   "--optimizer must be adamw or sgd, got '", optimizer, "'");
  TESSERA_CHECK_AS(ConfigError, beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
                   "--beta1 and --beta2 must be in [0, 1)");
  TESSERA_CHECK_AS(ConfigError, threads >= 0, "--threads must be >= 0 (0 = one per core)");
  TESSERA_CHECK_AS(ConfigError, eval_every >= 0 && save_every >= 0 && sample_tokens >= 0,
                   "--eval-every, --save-every and --sample-tokens must be >= 0");
  TESSERA_CHECK_AS(ConfigError, temperature > 0, "--temperature must be positive");
  TESSERA_CHECK_AS(ConfigError, top_k >= 0, "--top-k must be >= 0 (0 = no limit)");
}

}  // namespace tessera::train
