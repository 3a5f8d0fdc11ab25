#include "tessera/train/train_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/io/json_parse.h"

namespace tessera::train {

using nlohmann::json;

DType resolve(WireDtype w, kernels::Precision p) {
  switch (w) {
    case WireDtype::Fp32:
      return DType::F32;
    case WireDtype::Bf16:
      return DType::BF16;
    case WireDtype::Auto:
      break;
  }
  return p == kernels::Precision::BF16 ? DType::BF16 : DType::F32;
}

const char* to_string(OptimizerKind k) {
  return k == OptimizerKind::Sgd ? "sgd" : "adamw";
}

const char* to_string(WireDtype w) {
  return w == WireDtype::Auto ? "auto" : w == WireDtype::Fp32 ? "fp32" : "bf16";
}

std::string flag_of(const std::string& key) {
  std::string flag = "--" + key;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

namespace {

[[noreturn]] void wrong_type(const json& v, const std::string& key, const json& example) {
  throw ConfigError(detail::concat(config_key(key), " has the wrong type: got ", v.dump(),
                                   ", expected something like ", example.dump()));
}

// Strings and booleans as they are; numbers only when the value fits the field exactly (an
// integer field takes an integral value in its range, a float field a finite one in range), so
// that 1e300 or 4294967809 in an int is an error, not a silent wrap or undefined behaviour.
template <typename T>
T read_value(const json& v, const std::string& key, const json& example) {
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) wrong_type(v, key, example);
    return v.get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wrong_type(v, key, example);
    return v.get<bool>();
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
    TESSERA_CHECK_AS(ConfigError, ok, config_key(key), " is ", v.dump(),
                     ", which is not an integer in [", +limits::min(), ", ", +limits::max(), "]");
    return v.is_number_float()      ? static_cast<T>(v.get<double>())
           : v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>())
                                    : static_cast<T>(v.get<int64_t>());
  } else {
    static_assert(std::is_floating_point_v<T>);
    if (!v.is_number()) wrong_type(v, key, example);
    const double x = v.get<double>();
    TESSERA_CHECK_AS(ConfigError, std::isfinite(x) && std::fabs(x) <= std::numeric_limits<T>::max(),
                     config_key(key), " is ", v.dump(), ", which is not a finite number",
                     std::is_same_v<T, float> ? " in float range" : "");
    return static_cast<T>(x);
  }
}

// A field's own rule: "" when `v` is acceptable, else what is wrong ("must be positive").
template <typename T>
using Rule = std::function<std::string(const T& v)>;

template <typename T>
Rule<T> positive() {
  return [](const T& v) { return v > 0 ? "" : detail::concat("must be positive, got ", v); };
}
template <typename T>
Rule<T> at_least(T low, const char* what = "") {
  return [=](const T& v) {
    return v >= low ? "" : detail::concat("must be >= ", low, what, ", got ", v);
  };
}
// [low, high) or, with closed_high, [low, high]; NaN fails both.
template <typename T>
Rule<T> in_range(T low, T high, bool closed_high, const char* what = "") {
  return [=](const T& v) {
    const bool ok = v >= low && (closed_high ? v <= high : v < high);
    return ok ? ""
              : detail::concat("must be in [", low, ", ", high, closed_high ? "]" : ")", what,
                               ", got ", v);
  };
}

void apply_rule(const std::string& rule_result, const std::string& key) {
  if (!rule_result.empty()) throw ConfigError(detail::concat(config_key(key), " ", rule_result));
}

template <typename T>
ConfigField::Kind kind_of() {
  if constexpr (std::is_same_v<T, std::string>) return ConfigField::Kind::Text;
  if constexpr (std::is_same_v<T, bool>) return ConfigField::Kind::Boolean;
  if constexpr (std::is_integral_v<T>) return ConfigField::Kind::Integer;
  return ConfigField::Kind::Number;
}

// A field holding a value (number, text or boolean) with an optional rule.
template <typename T>
ConfigField value(const char* group, const char* key, T TrainConfig::*member, const char* help,
                  Rule<T> rule = {}) {
  ConfigField f;
  f.key = key;
  f.group = group;
  f.help = help;
  f.kind = kind_of<T>();
  f.get = [member](const TrainConfig& c) { return json(c.*member); };
  f.check = [member, rule, k = f.key](const TrainConfig& c) {
    if (rule) apply_rule(rule(c.*member), k);
  };
  f.set = [member, k = f.key, check = f.check](TrainConfig& c, const json& v) {
    c.*member = read_value<T>(v, k, json(TrainConfig{}.*member));
    check(c);
  };
  return f;
}

// An enumeration, read and written by name.
template <typename E>
ConfigField choice(const char* group, const char* key, E TrainConfig::*member, const char* help,
                   std::vector<std::pair<E, std::string>> names) {
  ConfigField f;
  f.key = key;
  f.group = group;
  f.help = help;
  f.kind = ConfigField::Kind::Choice;
  for (const auto& [e, name] : names) f.choices.push_back(name);
  f.get = [member, names](const TrainConfig& c) {
    for (const auto& [e, name] : names)
      if (e == c.*member) return json(name);
    return json(nullptr);  // not one of the values (a C++ caller's cast): check() says so
  };
  f.check = [member, names, k = f.key, choices = f.choices](const TrainConfig& c) {
    for (const auto& [e, name] : names)
      if (e == c.*member) return;
    throw ConfigError(detail::concat(config_key(k), " holds a value that is none of ",
                                     detail::join(choices, ", ")));
  };
  f.set = [member, names, k = f.key, choices = f.choices](TrainConfig& c, const json& v) {
    if (!v.is_string()) wrong_type(v, k, json(choices.front()));
    const std::string s = v.get<std::string>();
    for (const auto& [e, name] : names)
      if (name == s) {
        c.*member = e;
        return;
      }
    throw ConfigError(detail::concat(config_key(k), " must be ",
                                     detail::join(choices, ", ", " or "), ", got '", s, "'"));
  };
  return f;
}

std::vector<std::pair<DType, std::string>> float_dtypes() {
  return {{DType::F32, "fp32"}, {DType::BF16, "bf16"}};
}
std::vector<std::pair<WireDtype, std::string>> wire_dtypes() {
  return {{WireDtype::Auto, "auto"}, {WireDtype::Fp32, "fp32"}, {WireDtype::Bf16, "bf16"}};
}

void data_fields(std::vector<ConfigField>& f) {
  using T = TrainConfig;
  const char* data = "Data";
  f.push_back(value(data, "data", &T::data,
                    "Text file or directory, tessera token file, or raw uint16 .bin (nanoGPT); "
                    "empty: Debian's fortunes"));
  f.push_back(value(data, "vocab", &T::vocab, "BPE vocabulary size to train on text data",
                    in_range(257, 65535, true, " (the 256 bytes plus merges)")));
  f.push_back(value(data, "val_fraction", &T::val_fraction,
                    "Fraction of tokens held out for validation (0 disables)",
                    in_range(0.0, 1.0, false)));
  f.push_back(value(data, "cache_dir", &T::cache_dir,
                    "Where tokenizers and token files prepared from text are cached"));
}

void model_fields(std::vector<ConfigField>& f) {
  using T = TrainConfig;
  const char* model = "Model";
  f.push_back(value(model, "layers", &T::layers, "Transformer blocks", positive<int>()));
  f.push_back(value(model, "dim", &T::dim, "Model width (embedding size)", positive<int>()));
  f.push_back(value(model, "heads", &T::heads,
                    "Attention heads (must divide --dim); 0: 4 for a new model, from config.json "
                    "beside --init-from weights",
                    at_least(0, " (0: automatic)")));
  f.push_back(value(model, "seq", &T::seq,
                    "Sequence length (tokens per sample; the model's context)", positive<int>()));
  f.push_back(
      value(model, "dropout", &T::dropout, "Dropout probability", in_range(0.0f, 1.0f, false)));
  f.push_back(value(model, "init_from", &T::init_from,
                    "Start from these safetensors weights (HF GPT-2 names); the architecture "
                    "comes from them"));
  f.push_back(choice(model, "arch", &T::arch,
                     "Model family of a new model: gpt2 (learned positions, LayerNorm, GELU MLP, "
                     "tied head) or llama (rotary, RMSNorm, grouped-query attention, SwiGLU MLP)",
                     {{nn::Arch::Gpt2, "gpt2"}, {nn::Arch::Llama, "llama"}}));
  f.push_back(value(model, "model", &T::model,
                    "A Hugging Face config.json (model_type gpt2, llama, mistral or qwen2) giving "
                    "a new model's architecture (random weights; --seq is the context)"));
  f.push_back(value(model, "kv_heads", &T::kv_heads,
                    "--arch llama: key/value heads (grouped-query attention; 1: multi-query); 0: "
                    "--heads",
                    at_least(0, " (0: --heads)")));
  f.push_back(value(model, "ffn_dim", &T::ffn_dim,
                    "--arch llama: the SwiGLU MLP's hidden width; 0: 256 x ceil(8 dim / 3 / 256)",
                    at_least(0, " (0: Llama's rule)")));
  f.push_back(value(model, "rope_theta", &T::rope_theta, "--arch llama: rotary base theta",
                    positive<double>()));
  f.push_back(value(model, "tie_embeddings", &T::tie_embeddings,
                    "--arch llama: the output head reads the token embedding (false: its own "
                    "lm_head); GPT-2 is always tied"));
  f.push_back(value(model, "qkv_bias", &T::qkv_bias, "--arch llama: biases on q, k and v (Qwen2)"));
  f.push_back(value(model, "moe_experts", &T::moe_experts,
                    "Mixture of experts: experts per MoE block (GPT-2 MLPs; SwiGLU MLPs of "
                    "--moe-ffn-dim for --arch llama); 0 = dense MLPs",
                    at_least(0, " (0 = dense)")));
  f.push_back(value(model, "moe_top_k", &T::moe_top_k,
                    "Experts per token (their gates renormalised unless --moe-renormalize false); "
                    "ties go to the lower expert index"));
  f.push_back(value(model, "moe_every", &T::moe_every,
                    "Block l (0-based) is an MoE block when l % every == every - 1 (1: every "
                    "block)"));
  f.push_back(value(model, "moe_capacity_factor", &T::moe_capacity_factor,
                    "Per-sequence expert capacity ceil(factor x top_k x seq / experts); 0 = "
                    "dropless",
                    at_least(0.0f, " (0 = dropless)")));
  f.push_back(value(model, "moe_aux_loss", &T::moe_aux_loss,
                    "Switch load-balancing loss coefficient (alpha E sum_i f_i P_i, per sequence)",
                    at_least(0.0f)));
  f.push_back(value(model, "moe_z_loss", &T::moe_z_loss,
                    "Router z-loss coefficient (mean logsumexp^2)", at_least(0.0f)));
  f.push_back(
      choice(model, "moe_router", &T::moe_router,
             "The router's scores: softmax over the experts (Switch, Mixtral, Qwen2-MoE) "
             "or a sigmoid per expert (DeepSeek-V3; the balance loss reads them "
             "normalised)",
             {{nn::RouterScore::Softmax, "softmax"}, {nn::RouterScore::Sigmoid, "sigmoid"}}));
  f.push_back(value(model, "moe_renormalize", &T::moe_renormalize,
                    "Divide a token's top-k gates by their sum (Mixtral; Qwen2-MoE's "
                    "norm_topk_prob); false: the scores as they are"));
  f.push_back(value(model, "moe_bias_rate", &T::moe_bias_rate,
                    "Auxiliary-loss-free balancing (DeepSeek-V3): after each optimizer step every "
                    "expert's selection bias moves by this rate toward the mean load (bias += "
                    "rate x sign(mean load - load)); the bias chooses the top k, never weighs "
                    "them. 0: off",
                    at_least(0.0f, " (0 = off)")));
  f.push_back(value(model, "moe_ffn_dim", &T::moe_ffn_dim,
                    "--arch llama: an expert's SwiGLU width (fine-grained experts); 0: --ffn-dim's",
                    at_least(0, " (0: --ffn-dim's)")));
  f.push_back(value(model, "moe_shared_ffn_dim", &T::moe_shared_ffn_dim,
                    "--arch llama: the width of a shared expert every token passes through beside "
                    "its top k (a SwiGLU MLP, split over --tp like a dense one); 0: none",
                    at_least(0, " (0: none)")));
  f.push_back(value(model, "moe_shared_gate", &T::moe_shared_gate,
                    "--arch llama: scale the shared expert's output by sigmoid(x . w_gate) "
                    "(Qwen2-MoE's shared_expert_gate)"));
}

void optimisation_fields(std::vector<ConfigField>& f) {
  using T = TrainConfig;
  const char* opt = "Optimisation";
  f.push_back(value(opt, "steps", &T::steps, "Optimizer steps (the total, also when resuming)",
                    at_least<int64_t>(0)));
  f.push_back(value(opt, "batch", &T::batch, "Global batch size in sequences", positive<int>()));
  f.push_back(value(opt, "micro_batch", &T::micro_batch,
                    "Sequences per forward/backward (gradient accumulation); 0 = --batch",
                    at_least(0)));
  f.push_back(value(opt, "lr", &T::lr, "Peak learning rate", positive<float>()));
  f.push_back(value(opt, "warmup", &T::warmup, "Linear warmup steps (then cosine decay)",
                    at_least<int64_t>(0)));
  f.push_back(
      value(opt, "min_lr_ratio", &T::min_lr_ratio, "Final learning rate as a fraction of --lr"));
  f.push_back(value(opt, "weight_decay", &T::weight_decay,
                    "Decoupled weight decay (2-D weights only)", at_least(0.0f)));
  f.push_back(value(opt, "grad_clip", &T::grad_clip,
                    "Clip the global gradient norm to this (0 disables)",
                    at_least(0.0f, " (0 disables)")));
  f.push_back(choice(opt, "optimizer", &T::optimizer, "Optimizer",
                     {{OptimizerKind::AdamW, "adamw"}, {OptimizerKind::Sgd, "sgd"}}));
  f.push_back(value(opt, "momentum", &T::momentum, "SGD momentum"));
  f.push_back(value(opt, "beta1", &T::beta1, "AdamW beta1", in_range(0.0f, 1.0f, false)));
  f.push_back(value(opt, "beta2", &T::beta2, "AdamW beta2", in_range(0.0f, 1.0f, false)));
  f.push_back(
      value(opt, "seed", &T::seed, "Seed of initialisation, data order, dropout and sampling"));
}

void parallel_fields(std::vector<ConfigField>& f) {
  using T = TrainConfig;
  const char* par = "Parallelism";
  f.push_back(value(par, "dp", &T::dp,
                    "Data-parallel ranks (replicas): threads of this process, or under mpirun "
                    "processes (mpirun starts pp x dp x cp x tp)",
                    positive<int>()));
  f.push_back(value(par, "tp", &T::tp,
                    "Tensor-parallel ranks per replica (Megatron split; vocabulary-parallel "
                    "embedding and loss); the job has pp x dp x cp x tp ranks",
                    at_least(1, " (1 = no tensor parallelism)")));
  ConfigField sp = value(par, "sp", &T::sp,
                         "Sequence parallelism (needs --tp 2 or more): LayerNorms and dropout on "
                         "each tensor-parallel rank's slice of the tokens; all-gather / "
                         "reduce-scatter instead of all-reduce");
  sp.bare_flag = true;
  f.push_back(std::move(sp));
  f.push_back(value(par, "cp", &T::cp,
                    "Context-parallel ranks per replica: every sequence split over cp ranks (2 x "
                    "cp chunks, rank r holding chunks r and 2cp-1-r for causal balance; --seq a "
                    "multiple of 2 x cp), the attention exchanging keys and values (--cp-comm), "
                    "activation memory divided by cp; "
                    "for gradients and ZeRO the cp ranks are more data-parallel replicas. "
                    "Validation runs split the same way; the end-of-run sample runs whole on "
                    "every rank",
                    at_least(1, " (1 = no context parallelism)")));
  f.push_back(choice(par, "cp_comm", &T::cp_comm,
                     "How the context-parallel attention meets the rest of each sequence (bytes "
                     "a rank sends per layer and micro-batch, R its rows, KV its key/value width): "
                     "allgather (default, Llama 3's: K and V all-gathered, one kernel call, "
                     "dK/dV reduce-scattered; 24 KV R (cp-1)), ring (K/V blocks passed to the "
                     "next rank while computing with the held one, merged by log-sum-exp; "
                     "transfers hide behind compute and two blocks are held at cp 2; "
                     "8 KV R (3cp-3)), ulysses (all-to-all to head-split and back; bytes per "
                     "rank fall as 1/cp; cp must divide a tensor-parallel rank's query heads and "
                     "divide or be a multiple of its key/value heads)",
                     {{nn::CpComm::AllGather, "allgather"},
                      {nn::CpComm::Ring, "ring"},
                      {nn::CpComm::Ulysses, "ulysses"}}));
  f.push_back(value(par, "pp", &T::pp,
                    "Pipeline stages (ranks); the job has pp x dp x cp x tp ranks (Megatron's "
                    "order: tp fastest, then cp, then dp, then pp)",
                    at_least(1, " (1 = no pipeline)")));
  f.push_back(value(par, "ep", &T::ep,
                    "Expert-parallel ranks: each MoE block's experts split over ep ranks carved "
                    "from --dp (ep must divide dp and the expert count)",
                    at_least(1)));
  f.push_back(value(par, "pp_split", &T::pp_split,
                    "Units per model stage, e.g. 4,4 for 6 blocks (the embedding and the head "
                    "count as units; a block's attention and MLP halves 0.5 each, so 4.5,3.5 cuts "
                    "inside block 3); empty = balanced by modelled cost at half-block grain"));
  {
    std::vector<std::pair<parallel::ScheduleKind, std::string>> names;
    for (parallel::ScheduleKind k : parallel::pipeline_schedules())
      names.emplace_back(k, parallel::to_string(k));
    f.push_back(
        choice(par, "schedule", &T::schedule, "Pipeline schedule (with --pp 2 or more)", names));
  }
  f.push_back(value(par, "virtual_stages", &T::virtual_stages,
                    "Model chunks per pipeline rank (the interleaved schedule)", at_least(1)));
  f.push_back(value(par, "zero", &T::zero,
                    "ZeRO stage: 0 (plain DP), 1 (shard optimizer state), 2 (+ gradients), 3 (+ "
                    "parameters)",
                    in_range(0, 3, true)));
  f.push_back(value(par, "zero_shard_group", &T::zero_shard_group,
                    "The ranks that share ZeRO shards (HSDP): all (of dp x cp), host (the ranks "
                    "on one host, replicated across hosts: parameters gathered and gradients "
                    "reduce-scattered inside a host, shards all-reduced across), or a number of "
                    "ranks dividing dp x cp"));
  f.push_back(value(par, "bucket_mb", &T::bucket_mb,
                    "Gradient bucket size in MiB (communication granularity)", positive<double>()));
  f.push_back(value(par, "overlap", &T::overlap,
                    "Overlap gradient communication with backward (true/false)"));
  f.push_back(choice(par, "backend", &T::backend,
                     "Communication backend: auto (mpi under mpirun, else inproc), inproc, mpi",
                     {{comm::Backend::Auto, "auto"},
                      {comm::Backend::Inproc, "inproc"},
                      {comm::Backend::Mpi, "mpi"}}));
  f.push_back(value(par, "ranks_per_process", &T::ranks_per_process,
                    "Under mpirun: ranks run as this many threads of each process, in memory "
                    "inside a process and over MPI between processes, reductions in rank order "
                    "(the same bits for any mapping); world = processes x this. 0: one rank per "
                    "process",
                    at_least(0, " (0: one rank per process)")));
  f.push_back(
      choice(par, "recompute", &T::recompute,
             "Activation recomputation: none, selective (the attention output, rerun by the "
             "fused attention in backward; no T x T scores are kept in any mode, so it "
             "saves 4 C bytes a token per block) or full (whole blocks)",
             {{nn::Recompute::None, "none"},
              {nn::Recompute::Selective, "selective"},
              {nn::Recompute::Full, "full"}}));
}

void precision_fields(std::vector<ConfigField>& f) {
  using T = TrainConfig;
  using kernels::Bf16Gemm;
  using kernels::Precision;
  const char* prec = "Precision";
  f.push_back(choice(prec, "precision", &T::precision,
                     "GEMM precision: fp32, or bf16 (bf16 inputs, fp32 accumulation; fp32 master "
                     "weights, gradients, optimizer state, LayerNorm, softmax, attention, loss and "
                     "router)",
                     {{Precision::F32, "fp32"}, {Precision::BF16, "bf16"}}));
  f.push_back(choice(
      prec, "bf16_gemm", &T::bf16_gemm,
      "bf16 GEMM path: auto (the faster of the two, measured at start; emulated on "
      "a CPU without avx512_bf16 or amx_bf16), onednn, emulated (bf16-rounded "
      "inputs through OpenBLAS)",
      {{Bf16Gemm::Auto, "auto"}, {Bf16Gemm::OneDnn, "onednn"}, {Bf16Gemm::Emulated, "emulated"}}));
  f.push_back(choice(prec, "bf16_weight_copies", &T::bf16_weight_copies,
                     "bf16 copies of the GEMM weights, converted once per forward rather than at "
                     "every GEMM (2 bytes per weight; not under ZeRO-3): auto (on where the GEMMs "
                     "run through oneDNN), on, off",
                     {{nn::WeightCopies::Auto, "auto"},
                      {nn::WeightCopies::Always, "on"},
                      {nn::WeightCopies::Never, "off"}}));
  f.push_back(choice(prec, "grad_reduce_dtype", &T::grad_reduce_dtype,
                     "Data-parallel gradient reduction in fp32 or bf16 (half the bytes; fp32 "
                     "accumulation)",
                     float_dtypes()));
  f.push_back(choice(prec, "param_gather_dtype", &T::param_gather_dtype,
                     "ZeRO-3 parameter all-gathers in auto (= --precision), fp32 or bf16 (each "
                     "rank rounds its fp32 master shard: half the bytes; the model reads the bf16 "
                     "values)",
                     wire_dtypes()));
  f.push_back(choice(prec, "activation_comm_dtype", &T::activation_comm_dtype,
                     "Tensor- and pipeline-parallel activations and their gradients sent in auto "
                     "(= --precision), fp32 or bf16 (rounded to send, widened on arrival: half "
                     "the bytes)",
                     wire_dtypes()));
  f.push_back(choice(prec, "export_dtype", &T::export_dtype,
                     "model.safetensors in fp32 or bf16 (checkpoints always hold the fp32 "
                     "masters)",
                     float_dtypes()));
  f.push_back(value(prec, "export_shard_mb", &T::export_shard_mb,
                    "Exported weights in Hugging Face's shards of at most this many MiB "
                    "(model-0000K-of-0000N.safetensors and model.safetensors.index.json); 0: one "
                    "model.safetensors",
                    at_least(0.0, " (0: one file)")));
  f.push_back(value(prec, "peak_gflops", &T::peak_gflops,
                    "One rank's GEMM peak in GFLOP/s for the precision in use, for the progress "
                    "line's MFU; 0 = measured at start: one core's best 1024^3 GEMM in CPU time x "
                    "the rank's threads",
                    at_least(0.0, " (0: measure it at start)")));
}

void run_fields(std::vector<ConfigField>& f) {
  using T = TrainConfig;
  const char* run = "Run";
  f.push_back(choice(run, "device", &T::device,
                     "Where each rank's model runs: cpu, or cuda (one GPU; ranks of one process "
                     "share device 0 and sum their gradients through host memory). cuda runs "
                     "GPT-2 with data parallelism (--dp, ZeRO 0) and adamw so far",
                     {{Device::Cpu, "cpu"}, {Device::Cuda, "cuda"}}));
  f.push_back(
      choice(run, "device_comm", &T::device_comm,
             "How --device cuda ranks sum their gradients: auto (NCCL when each rank of "
             "the gradient group has its own GPU, else through host memory), nccl, or host",
             {{DeviceComm::Auto, "auto"}, {DeviceComm::Nccl, "nccl"}, {DeviceComm::Host, "host"}}));
  f.push_back(value(run, "comm_timeout", &T::comm_timeout,
                    "Seconds a rank waits for its peers in any communication call before the run "
                    "fails with an error naming the call (0: TESSERA_COMM_TIMEOUT_S, else 300)",
                    in_range(0.0, 86400.0 * 365, true, " seconds (0: the default)")));
  f.push_back(value(run, "io_timeout", &T::io_timeout,
                    "Seconds the other ranks wait while rank 0 writes a checkpoint (or, under "
                    "mpirun, prepares the data and reads the checkpoint) before the run fails; "
                    "never below --comm-timeout",
                    Rule<double>([](const double& v) -> std::string {
                      if (v > 0 && v <= 86400.0 * 365) return "";
                      return detail::concat("must be a number of seconds in (0, 1 year], got ", v);
                    })));
  f.push_back(value(run, "flight_recorder", &T::flight_recorder,
                    "Dump each rank's last communication calls to DIR/rank-<R>.json when a call "
                    "fails or times out, a rank errs, a fault is injected or the process gets "
                    "SIGUSR2; `tessera doctor DIR` says what happened (empty: "
                    "TESSERA_FLIGHT_RECORDER, else no dumps)"));
  f.push_back(value(run, "trace", &T::trace,
                    "Write the timeline (Chrome trace-event JSON, one track per rank) to this "
                    "file"));
  f.push_back(value(run, "threads", &T::threads,
                    "Compute (BLAS) threads per rank; 0 = the cores divided among the ranks",
                    at_least(0, " (0 = the cores divided among the ranks)")));
  f.push_back(value(run, "memory_limit", &T::memory_limit,
                    "Emulated device memory per rank, e.g. 2GiB (empty: unlimited)",
                    Rule<std::string>([](const std::string& v) -> std::string {
                      if (!v.empty()) (void)parse_bytes(v);  // ConfigError saying what it takes
                      return "";
                    })));
  f.push_back(value(run, "save", &T::save,
                    "Checkpoint directory (also exports model.safetensors, config.json, "
                    "tokenizer.json)"));
  f.push_back(value(run, "resume", &T::resume, "Resume from this checkpoint directory"));
  f.push_back(value(run, "save_every", &T::save_every,
                    "Save a checkpoint every N steps (0: only at the end)", at_least<int64_t>(0)));
  ConfigField save_async =
      value(run, "save_async", &T::save_async,
            "Write the --save-every checkpoints in the background while training goes on "
            "(on by default; --save-async=false: each save blocks until written): rank 0 keeps "
            "one host copy of the saved state (weights and optimizer state) until the write ends, "
            "a save waits for the one before, and the end of the run, a stop or an error waits "
            "for the write in flight (--io-timeout); a crash mid-write leaves the previous "
            "checkpoint");
  save_async.bare_flag = true;
  f.push_back(std::move(save_async));
  f.push_back(value(run, "metrics", &T::metrics, "Write metrics as JSON lines to this file"));
  const char* restarts = "Restarts";
  f.push_back(value(restarts, "max_restarts", &T::max_restarts,
                    "Supervise the run: when it fails (a rank errs, exits, crashes or hangs), end "
                    "it and start it again from the newest checkpoint in --save, up to this many "
                    "times (0: no supervisor); a configuration error or a stop by signal is not "
                    "restarted",
                    in_range(0, 1000, true)));
  f.push_back(value(restarts, "min_dp", &T::min_dp,
                    "With --max-restarts: a data-parallel replica whose rank fails in two attempts "
                    "in a row is dropped and the run goes on with fewer replicas, down to this "
                    "many, keeping --batch through more micro-batches (0: never drop one)",
                    at_least(0, " (0: never drop a replica)")));
  f.push_back(value(restarts, "hang_timeout", &T::hang_timeout,
                    "With --max-restarts: end an attempt that finishes no step for this many "
                    "seconds (0: --io-timeout + 2 x the communication deadline)",
                    in_range(0.0, 86400.0 * 365, true, " seconds (0: the default)")));
  f.push_back(value(restarts, "mpirun", &T::mpirun,
                    "With --max-restarts: start each attempt's ranks with this command (mpirun "
                    "and its options, e.g. 'mpirun --host a:2,b:2'; -np is added), instead of as "
                    "threads of one process"));
  f.push_back(value(run, "eval_every", &T::eval_every,
                    "Validate every N steps (0: only at the end)", at_least<int64_t>(0)));
  f.push_back(value(run, "eval_batches", &T::eval_batches,
                    "Validation batches of --batch sequences (the same windows in every layout)",
                    positive<int>()));
  f.push_back(value(run, "sample_tokens", &T::sample_tokens,
                    "Tokens to generate at the end (0: none)", at_least(0)));
  f.push_back(value(run, "prompt", &T::prompt, "Prompt of the final sample"));
  f.push_back(
      value(run, "temperature", &T::temperature, "Sampling temperature", positive<float>()));
  f.push_back(value(run, "top_k", &T::top_k, "Sample from the k most likely tokens (0: all)",
                    at_least(0, " (0 = no limit)")));
  f.push_back(value(run, "log_every", &T::log_every,
                    "Progress line every N steps when not on a terminal", positive<int>()));
}

std::vector<ConfigField> make_fields() {
  std::vector<ConfigField> f;
  for (auto add : {data_fields, model_fields, optimisation_fields, parallel_fields,
                   precision_fields, run_fields})
    add(f);
  return f;
}

}  // namespace

const std::vector<ConfigField>& train_config_fields() {
  static const std::vector<ConfigField> fields = make_fields();
  return fields;
}

json value_from_text(const ConfigField& f, const std::string& text) {
  auto bad = [&](const char* what) -> json {
    throw ConfigError(detail::concat(config_key(f.key), " must be ", what, ", got '", text, "'"));
  };
  switch (f.kind) {
    case ConfigField::Kind::Text:
    case ConfigField::Kind::Choice:
      return text;  // a choice is checked by set()
    case ConfigField::Kind::Boolean:
      if (text == "true" || text == "1" || text == "on" || text == "yes") return true;
      if (text == "false" || text == "0" || text == "off" || text == "no") return false;
      return bad("true or false");
    case ConfigField::Kind::Integer:
    case ConfigField::Kind::Number: {
      // JSON's number syntax (so "0x10" or "1e" are errors, and integers stay exact).
      json v;
      try {
        v = json::parse(text);
      } catch (const json::exception&) {
        return bad("a number");
      }
      if (!v.is_number()) return bad("a number");
      return v;
    }
  }
  return bad("a value");
}

json to_json(const TrainConfig& c) {
  json j = json::object();
  for (const ConfigField& f : train_config_fields()) j[f.key] = f.get(c);
  return j;
}

TrainConfig train_config_from_json(const json& j) {
  TESSERA_CHECK_AS(ConfigError, j.is_object(), "a training config must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const ConfigField& f : train_config_fields()) known = known || f.key == key;
    TESSERA_CHECK_AS(ConfigError, known, "unknown config key '", key,
                     "'; run `tessera train --help` for the accepted keys");
    (void)value;
  }
  TrainConfig c;
  for (const ConfigField& f : train_config_fields())
    if (j.contains(f.key)) f.set(c, j.at(f.key));
  return c;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK_AS(ConfigError, in.good(), "cannot open config file '", path, "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return io::parse_json(text);
  } catch (const json::exception& e) {
    throw ConfigError(detail::concat("config file '", path, "' is not valid JSON: ", e.what()));
  }
}

void check_tensor_parallel(int heads, int dim, int tp) {
  TESSERA_CHECK_AS(ConfigError, heads % tp == 0, config_key("tp"), " ", tp, " does not divide the ",
                   heads, " attention heads; choose ", config_key("tp"),
                   " among the divisors of the head count");
  TESSERA_CHECK_AS(ConfigError, (4 * static_cast<int64_t>(dim)) % tp == 0, config_key("tp"), " ",
                   tp, " does not divide the MLP width 4 x dim = ", 4 * static_cast<int64_t>(dim),
                   "; choose ", config_key("tp"), " dividing it");
}

void check_tensor_parallel(const nn::GPTConfig& m, int tp) {
  if (!m.llama()) return check_tensor_parallel(m.n_head, m.n_embd, tp);
  TESSERA_CHECK_AS(ConfigError, m.n_head % tp == 0 && m.kv_heads() % tp == 0, config_key("tp"), " ",
                   tp, " must divide the ", m.n_head, " attention heads and the ", m.kv_heads(),
                   " key/value heads (tensor parallelism splits key/value heads, it does not "
                   "replicate them); choose ",
                   config_key("tp"), " among the divisors of both");
  bool dense = false;  // a block with a dense MLP (a mixture's experts are whole on every tp rank)
  for (int l = 0; l < m.n_layer; ++l) dense = dense || !m.moe.is_moe_layer(l);
  TESSERA_CHECK_AS(ConfigError, !dense || m.mlp_hidden() % tp == 0, config_key("tp"), " ", tp,
                   " does not divide the MLP width ", m.mlp_hidden(), "; choose ", config_key("tp"),
                   " dividing it");
  TESSERA_CHECK_AS(ConfigError, m.moe.shared_ffn_dim % tp == 0, config_key("tp"), " ", tp,
                   " does not divide the shared expert's width ", m.moe.shared_ffn_dim, " (",
                   config_key("moe_shared_ffn_dim"), "); choose ", config_key("tp"),
                   " dividing it");
}

int parse_zero_shard_group(const std::string& setting) {
  if (setting == "all" || setting.empty()) return 0;
  if (setting == "host") return -1;
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(setting, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TESSERA_CHECK_AS(ConfigError, used == setting.size() && n >= 1, config_key("zero_shard_group"),
                   " must be all, host or a number of ranks, got '", setting, "'");
  return n;
}

void TrainConfig::validate() const {
  for (const ConfigField& f : train_config_fields()) f.check(*this);
  auto key = [](const char* k) { return config_key(k); };
  const bool new_model = resume.empty() && init_from.empty();
  TESSERA_CHECK_AS(ConfigError, dim % new_model_heads() == 0, key("heads"), " ", new_model_heads(),
                   " does not divide ", key("dim"), " ", dim,
                   "; choose heads so that dim/heads is a whole number");
  if (new_model && model.empty() && arch == nn::Arch::Gpt2)
    check_tensor_parallel(new_model_heads(), dim, tp);
  TESSERA_CHECK_AS(
      ConfigError,
      arch == nn::Arch::Llama || (kv_heads == 0 && ffn_dim == 0 && tie_embeddings && !qkv_bias),
      key("kv_heads"), ", ", key("ffn_dim"), ", ", key("tie_embeddings"), " and ", key("qkv_bias"),
      " are settings of ", key("arch"), " llama");
  TESSERA_CHECK_AS(ConfigError, !sp || tp > 1, key("sp"),
                   " (sequence parallelism) splits the sequence over the tensor-parallel ranks: "
                   "it needs ",
                   key("tp"), " 2 or more, got ", key("tp"), " ", tp, " (", key("sp"),
                   "=false turns it off, e.g. to resume an ", key("sp"), " checkpoint at ",
                   key("tp"), " 1)");
  TESSERA_CHECK_AS(ConfigError,
                   virtual_stages == 1 || (pp > 1 && parallel::traits(schedule).interleaved),
                   key("virtual_stages"), " ", virtual_stages, " needs ", key("schedule"),
                   " interleaved and ", key("pp"), " > 1 (model chunks per pipeline rank)");
  if (pp > 1 && new_model)
    TESSERA_CHECK_AS(ConfigError, pp * virtual_stages <= layers + 2, key("pp"), " ", pp, " x ",
                     key("virtual_stages"), " ", virtual_stages, " = ", pp * virtual_stages,
                     " stages, but the model has only ", layers + 2, " units (the embedding, ",
                     layers, " blocks and the head); each stage needs at least one");
  TESSERA_CHECK_AS(ConfigError, min_dp <= dp, key("min_dp"), " ", min_dp, " is above ", key("dp"),
                   " ", dp, "; it is the fewest data-parallel replicas a restart may go on with");
  TESSERA_CHECK_AS(ConfigError, max_restarts > 0 || (min_dp == 0 && mpirun.empty()),
                   key(min_dp > 0 ? "min_dp" : "mpirun"), " is a setting of the supervisor: give ",
                   key("max_restarts"), " N too");
  TESSERA_CHECK_AS(ConfigError, cp == 1 || seq % (2 * cp) == 0, key("seq"), " ", seq,
                   " is not divisible by 2 x ", key("cp"), " ", cp, " = ", 2 * cp,
                   " (context parallelism cuts each sequence into 2 x cp chunks, rank r holding "
                   "chunks r and 2cp-1-r); choose a ",
                   key("seq"), " that is a multiple of ", 2 * cp);
  TESSERA_CHECK_AS(ConfigError, ranks_per_process == 0 || world() % ranks_per_process == 0,
                   key("ranks_per_process"), " ", ranks_per_process, " does not divide the ",
                   world(), " ranks of the layout; each process runs that many ranks");
  TESSERA_CHECK_AS(ConfigError, batch % dp == 0, key("batch"), " ", batch, " does not split over ",
                   key("dp"), " ", dp, " ranks; choose a batch that is a multiple of dp");
  TESSERA_CHECK_AS(ConfigError, micro_batch == 0 || (batch / dp) % micro_batch == 0,
                   key("micro_batch"), " ", micro_batch, " must divide the per-rank batch ",
                   batch / dp, " (", key("batch"), " ", batch, " / ", key("dp"), " ", dp, ")");
  TESSERA_CHECK_AS(ConfigError, dp % ep == 0, key("ep"), " ", ep, " must divide ", key("dp"), " ",
                   dp, " (the expert-parallel ranks are carved from the data-parallel ranks)");
  {
    const int shard = parse_zero_shard_group(zero_shard_group);  // -1: host, decided at launch
    TESSERA_CHECK_AS(ConfigError, shard == 0 || zero > 0 || shard == dp * cp,
                     key("zero_shard_group"), " ", zero_shard_group,
                     " shards ZeRO's state over part of the data-parallel ranks: it needs ",
                     key("zero"), " 1, 2 or 3");
    TESSERA_CHECK_AS(ConfigError, shard <= 0 || (dp * cp) % shard == 0, key("zero_shard_group"),
                     " ", shard, " must divide the ", dp * cp, " ranks that share the gradients (",
                     key("dp"), " ", dp, cp > 1 ? " x " + key("cp") + " " + std::to_string(cp) : "",
                     ")");
  }
  if (new_model) {
    TESSERA_CHECK_AS(ConfigError, ep == 1 || moe_experts > 0, key("ep"), " ", ep,
                     " needs a mixture of experts: set ", key("moe_experts"),
                     " (a multiple of ep)");
    TESSERA_CHECK_AS(ConfigError, moe_experts % ep == 0, key("moe_experts"), " ", moe_experts,
                     " does not split over ", key("ep"), " ", ep,
                     " ranks; choose an expert count that is a multiple of ep");
    TESSERA_CHECK_AS(ConfigError, moe_experts == 0 || (moe_top_k >= 1 && moe_top_k <= moe_experts),
                     key("moe_top_k"), " ", moe_top_k,
                     " must be between 1 and the number of experts (", key("moe_experts"), " ",
                     moe_experts, ")");
    TESSERA_CHECK_AS(ConfigError, moe_experts == 0 || (moe_every >= 1 && moe_every <= layers),
                     key("moe_every"), " ", moe_every, " must be between 1 and ", key("layers"),
                     " ", layers);
    TESSERA_CHECK_AS(ConfigError,
                     (moe_ffn_dim == 0 && moe_shared_ffn_dim == 0 && !moe_shared_gate) ||
                         (arch == nn::Arch::Llama && moe_experts > 0),
                     key("moe_ffn_dim"), ", ", key("moe_shared_ffn_dim"), " and ",
                     key("moe_shared_gate"), " are settings of a mixture of experts (",
                     key("moe_experts"), ") of ", key("arch"), " llama");
    TESSERA_CHECK_AS(ConfigError, !moe_shared_gate || moe_shared_ffn_dim > 0,
                     key("moe_shared_gate"), " gates the shared expert: set ",
                     key("moe_shared_ffn_dim"));
  }
  if (device == Device::Cuda) {
    // What the device path runs so far (train/device_steps.h); the rest says so by name.
    auto need = [&](bool ok, const std::string& what) {
      TESSERA_CHECK_AS(ConfigError, ok, key("device"), " cuda does not run ", what, " yet; use ",
                       key("device"), " cpu for it");
    };
    need(tp == 1 && pp == 1 && cp == 1 && ep == 1,
         detail::concat("tensor, pipeline, context or expert parallelism (", key("tp"), " ", tp,
                        ", ", key("pp"), " ", pp, ", ", key("cp"), " ", cp, ", ", key("ep"), " ",
                        ep, ")"));
    need(zero == 0, detail::concat(key("zero"), " ", zero));
    need(optimizer == OptimizerKind::AdamW, detail::concat(key("optimizer"), " sgd"));
    need(arch == nn::Arch::Gpt2, "the Llama family");
    need(moe_experts == 0, "mixtures of experts");
    need(recompute == nn::Recompute::None, detail::concat(key("recompute"),
                                                          " (it keeps every "
                                                          "activation on the device)"));
  }
}

}  // namespace tessera::train
