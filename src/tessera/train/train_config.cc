#include "tessera/train/train_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "tessera/core/error.h"
#include "tessera/io/json_parse.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/gpt_config.h"

namespace tessera::train {

// One list of (key, member) pairs drives both directions of the JSON mapping.
// clang-format off
#define TESSERA_TRAIN_CONFIG_FIELDS(X)                                                        \
  X(data) X(vocab) X(val_fraction) X(cache_dir)                                               \
  X(layers) X(dim) X(heads) X(seq) X(dropout) X(init_from)                                    \
  X(moe_experts) X(moe_top_k) X(moe_every) X(moe_capacity_factor) X(moe_aux_loss) X(moe_z_loss) \
  X(steps) X(batch) X(micro_batch) X(lr) X(warmup) X(min_lr_ratio) X(weight_decay)           \
  X(grad_clip) X(optimizer) X(momentum) X(beta1) X(beta2) X(seed)                             \
  X(dp) X(tp) X(sp) X(pp) X(ep) X(pp_split) X(schedule) X(virtual_stages) X(zero) X(bucket_mb) X(overlap) X(backend) X(trace) X(recompute) X(precision) X(bf16_gemm) X(bf16_weight_copies) X(grad_reduce_dtype) X(export_dtype) X(param_gather_dtype) X(activation_comm_dtype) X(peak_gflops) X(comm_timeout) X(io_timeout) \
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

namespace {

[[noreturn]] void wrong_type(const nlohmann::json& v, const char* key,
                             const nlohmann::json& example) {
  throw ConfigError(detail::concat("config key '", key, "' has the wrong type: got ", v.dump(),
                                   ", expected something like ", example.dump()));
}

// Strings and booleans as they are; numbers only when the value fits the field exactly (an
// integer field takes an integral value in its range, a float field a finite one in range), so
// that 1e300 or 4294967809 in an int is an error, not a silent wrap or undefined behaviour.
template <typename T>
void read_value(const nlohmann::json& v, const char* key, const nlohmann::json& example, T& out) {
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) wrong_type(v, key, example);
    out = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wrong_type(v, key, example);
    out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    using limits = std::numeric_limits<T>;
    bool ok = false;
    if (v.is_number_unsigned()) {
      ok = v.get<uint64_t>() <= static_cast<uint64_t>(limits::max());
    } else if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      ok = x >= 0 ? static_cast<uint64_t>(x) <= static_cast<uint64_t>(limits::max())
                  : limits::is_signed && x >= static_cast<int64_t>(limits::min());
    } else if (v.is_number_float()) {
      // 2^64 and 2^63 are exact doubles; an integral value below them converts exactly.
      const double x = v.get<double>();
      ok = std::isfinite(x) && x == std::floor(x) && x >= static_cast<double>(limits::min()) &&
           x < std::ldexp(1.0, limits::digits);
    } else {
      wrong_type(v, key, example);
    }
    TESSERA_CHECK_AS(ConfigError, ok, "config key '", key, "' is ", v.dump(),
                     ", which is not an integer in [", +limits::min(), ", ", +limits::max(), "]");
    out = v.is_number_float()      ? static_cast<T>(v.get<double>())
          : v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>())
                                   : static_cast<T>(v.get<int64_t>());
  } else {
    static_assert(std::is_floating_point_v<T>);
    if (!v.is_number()) wrong_type(v, key, example);
    const double x = v.get<double>();
    TESSERA_CHECK_AS(ConfigError, std::isfinite(x) && std::fabs(x) <= std::numeric_limits<T>::max(),
                     "config key '", key, "' is ", v.dump(), ", which is not a finite number",
                     std::is_same_v<T, float> ? " in float range" : "");
    out = static_cast<T>(x);
  }
}

}  // namespace

TrainConfig train_config_from_json(const nlohmann::json& j) {
  TESSERA_CHECK_AS(ConfigError, j.is_object(), "a training config must be a JSON object");
  TrainConfig c;
  nlohmann::json known = to_json(c);
  for (const auto& [key, value] : j.items()) {
    TESSERA_CHECK_AS(ConfigError, known.contains(key), "unknown config key '", key,
                     "'; run `tessera train --help` for the accepted keys");
    (void)value;
  }
#define X(name) \
  if (j.contains(#name)) read_value(j.at(#name), #name, known.at(#name), c.name);
  TESSERA_TRAIN_CONFIG_FIELDS(X)
#undef X
  return c;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK_AS(ConfigError, in.good(), "cannot open config file '", path, "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return io::parse_json(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(detail::concat("config file '", path, "' is not valid JSON: ", e.what()));
  }
}

DType float_dtype(const std::string& s, const char* flag) {
  return kernels::parse_precision(s, flag) == kernels::Precision::BF16 ? DType::BF16 : DType::F32;
}

DType comm_dtype(const std::string& s, const std::string& precision, const char* flag) {
  TESSERA_CHECK_AS(ConfigError, s == "auto" || s == "fp32" || s == "bf16", flag,
                   " must be auto (the --precision), fp32 or bf16, got '", s, "'");
  return float_dtype(s == "auto" ? precision : s, flag);
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
  TESSERA_CHECK_AS(ConfigError, !sp || tp > 1,
                   "--sp (sequence parallelism) splits the sequence over the tensor-parallel "
                   "ranks: it needs --tp 2 or more, got --tp ",
                   tp, " (--sp=false turns it off, e.g. to resume an --sp checkpoint at --tp 1)");
  TESSERA_CHECK_AS(ConfigError, pp >= 1, "--pp must be at least 1 (1 = no pipeline), got ", pp);
  TESSERA_CHECK_AS(ConfigError, virtual_stages >= 1, "--virtual-stages must be at least 1, got ",
                   virtual_stages);
  TESSERA_CHECK_AS(ConfigError, virtual_stages == 1 || (pp > 1 && schedule == "interleaved"),
                   "--virtual-stages ", virtual_stages,
                   " needs --schedule interleaved and --pp > 1 (model chunks per pipeline rank)");
  if (pp > 1 && resume.empty() && init_from.empty())
    TESSERA_CHECK_AS(ConfigError, pp * virtual_stages <= layers + 2, "--pp ", pp,
                     " x --virtual-stages ", virtual_stages, " = ", pp * virtual_stages,
                     " stages, but the model has only ", layers + 2, " units (the embedding, ",
                     layers, " blocks and the head); each stage needs at least one");
  TESSERA_CHECK_AS(ConfigError, batch % dp == 0, "--batch ", batch, " does not split over --dp ",
                   dp, " ranks; choose a batch that is a multiple of dp");
  TESSERA_CHECK_AS(ConfigError,
                   micro_batch >= 0 && (micro_batch == 0 || (batch / dp) % micro_batch == 0),
                   "--micro-batch ", micro_batch, " must divide the per-rank batch ", batch / dp,
                   " (--batch ", batch, " / --dp ", dp, ")");
  TESSERA_CHECK_AS(ConfigError, zero >= 0 && zero <= 3, "--zero must be 0, 1, 2 or 3, got ", zero);
  TESSERA_CHECK_AS(ConfigError, ep >= 1 && dp % ep == 0, "--ep ", ep, " must divide --dp ", dp,
                   " (the expert-parallel ranks are carved from the data-parallel ranks)");
  TESSERA_CHECK_AS(ConfigError, moe_experts >= 0, "--moe-experts must be >= 0 (0 = dense), got ",
                   moe_experts);
  if (resume.empty() && init_from.empty()) {
    TESSERA_CHECK_AS(ConfigError, ep == 1 || moe_experts > 0, "--ep ", ep,
                     " needs a mixture of experts: set --moe-experts (a multiple of ep)");
    TESSERA_CHECK_AS(ConfigError, moe_experts % ep == 0, "--moe-experts ", moe_experts,
                     " does not split over --ep ", ep,
                     " ranks; choose an expert count that is a multiple of ep");
    TESSERA_CHECK_AS(ConfigError, moe_experts == 0 || (moe_top_k >= 1 && moe_top_k <= moe_experts),
                     "--moe-top-k ", moe_top_k,
                     " must be between 1 and the number of experts (--moe-experts ", moe_experts,
                     ")");
    TESSERA_CHECK_AS(ConfigError, moe_experts == 0 || (moe_every >= 1 && moe_every <= layers),
                     "--moe-every ", moe_every, " must be between 1 and --layers ", layers);
  }
  TESSERA_CHECK_AS(ConfigError, moe_capacity_factor >= 0,
                   "--moe-capacity-factor must be >= 0 (0 = dropless), got ", moe_capacity_factor);
  TESSERA_CHECK_AS(ConfigError, moe_aux_loss >= 0 && moe_z_loss >= 0,
                   "--moe-aux-loss and --moe-z-loss must be >= 0");
  nn::parse_recompute(recompute);       // throws a ConfigError naming the accepted values
  kernels::parse_precision(precision);  // likewise
  kernels::parse_bf16_gemm(bf16_gemm);
  nn::parse_weight_copies(bf16_weight_copies);
  float_dtype(grad_reduce_dtype, "--grad-reduce-dtype");
  float_dtype(export_dtype, "--export-dtype");
  comm_dtype(param_gather_dtype, precision, "--param-gather-dtype");
  comm_dtype(activation_comm_dtype, precision, "--activation-comm-dtype");
  TESSERA_CHECK_AS(
      ConfigError, peak_gflops >= 0 && std::isfinite(peak_gflops),
      "--peak-gflops must be a rate in GFLOP/s per rank (0: measure it at start), got ",
      peak_gflops);
  TESSERA_CHECK_AS(ConfigError, bucket_mb > 0, "--bucket-mb must be positive, got ", bucket_mb);
  TESSERA_CHECK_AS(ConfigError, comm_timeout >= 0 && comm_timeout <= 86400 * 365,
                   "--comm-timeout must be a number of seconds in [0, 1 year] (0: "
                   "TESSERA_COMM_TIMEOUT_S or 300 s), got ",
                   comm_timeout);
  TESSERA_CHECK_AS(ConfigError, io_timeout > 0 && io_timeout <= 86400 * 365,
                   "--io-timeout must be a number of seconds in (0, 1 year], got ", io_timeout);
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
