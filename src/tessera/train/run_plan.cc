#include "tessera/train/run_plan.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/data/sampler.h"
#include "tessera/io/hf_config.h"
#include "tessera/kernels/gemm_peak.h"
#include "tessera/nn/context_parallel_attention.h"
#include "tessera/train/model_io.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// The tokenizer saved with a checkpoint or beside weights, if any: its tokenizer.json, or the
// folder when a SentencePiece tokenizer.model is there (data::load_tokenizer picks the file).
std::optional<fs::path> tokenizer_beside(const fs::path& p) {
  for (fs::path dir : {p, p.parent_path(), p.parent_path().parent_path()}) {
    if (dir.empty()) continue;
    if (fs::exists(dir / "tokenizer.model")) return dir;
    if (fs::exists(dir / "tokenizer.json")) return dir / "tokenizer.json";
  }
  return std::nullopt;
}

}  // namespace

RunPlan make_plan(const TrainConfig& cfg, std::FILE* log) {
  RunPlan plan;
  if (!cfg.resume.empty()) {
    TESSERA_CHECK_AS(ConfigError, fs::exists(cfg.resume), config_key("resume"), ": '", cfg.resume,
                     "' does not exist");
    plan.ckpt.emplace(io::load_checkpoint(cfg.resume));
  }
  // Model configuration: from the checkpoint, the weights, or the flags (vocabulary from data).
  nn::GPTConfig& mcfg = plan.mcfg;
  const bool from_weights = plan.ckpt.has_value() || !cfg.init_from.empty();
  if (plan.ckpt)
    mcfg = from_hf_config(plan.ckpt->config, cfg.dropout);
  else if (!cfg.init_from.empty())
    mcfg = from_hf_config(
        config_of_weights(cfg.init_from,
                          cfg.heads > 0 ? std::optional<int>(cfg.heads) : std::nullopt),
        cfg.dropout);
  else if (!cfg.model.empty())  // a new model of a Hugging Face architecture
    mcfg = from_hf_config(io::read_hf_config(cfg.model), cfg.dropout);
  const bool fixed = from_weights || !cfg.model.empty();  // the vocabulary is the model's

  // Data. With existing weights, token ids are bounded by their vocabulary.
  data::DataOptions dopt;
  dopt.data = cfg.data;
  dopt.vocab_size = fixed ? mcfg.vocab_size : cfg.vocab;
  dopt.cache_dir = cfg.cache_dir;
  if (plan.ckpt)
    dopt.tokenizer = tokenizer_beside(plan.ckpt->dir);
  else if (!cfg.init_from.empty())
    dopt.tokenizer = tokenizer_beside(weights_file(cfg.init_from).parent_path());
  plan.pd = data::prepare_data(dopt);
  if (log) std::fprintf(log, "data: %s\n", plan.pd.description.c_str()), std::fflush(log);
  if (!fixed) {
    mcfg.arch = cfg.arch;
    if (cfg.arch == nn::Arch::Llama) {
      mcfg.n_kv_head = cfg.kv_heads;
      mcfg.ffn_dim = cfg.ffn_dim;
      mcfg.rope_theta = cfg.rope_theta;
      mcfg.tie_embeddings = cfg.tie_embeddings;
      mcfg.qkv_bias = cfg.qkv_bias;
    }
    mcfg.moe.experts = cfg.moe_experts;
    mcfg.moe.top_k = cfg.moe_top_k;
    mcfg.moe.every = cfg.moe_every;
    mcfg.moe.capacity_factor = cfg.moe_capacity_factor;
    mcfg.moe.score = cfg.moe_router;
    mcfg.moe.renormalize = cfg.moe_renormalize;
    mcfg.moe.ffn_dim = cfg.moe_ffn_dim;
    mcfg.moe.shared_ffn_dim = cfg.moe_shared_ffn_dim;
    mcfg.moe.shared_gate = cfg.moe_shared_gate;
    mcfg.n_layer = cfg.layers;
    mcfg.n_embd = cfg.dim;
    mcfg.n_head = cfg.new_model_heads();
    mcfg.block_size = cfg.seq;
    mcfg.vocab_size = static_cast<int>(plan.pd.vocab_size);
    mcfg.dropout = cfg.dropout;
  }
  // A rotary model has no table of positions: it runs at the training context, up to its own.
  if (mcfg.llama()) mcfg.block_size = cfg.seq;
  TESSERA_CHECK_AS(ConfigError, plan.pd.vocab_size <= mcfg.vocab_size,
                   "the data uses token ids up to ", plan.pd.vocab_size - 1,
                   " but the model's vocabulary has only ", mcfg.vocab_size, " entries");
  TESSERA_CHECK_AS(ConfigError, cfg.seq <= mcfg.block_size, config_key("seq"), " ", cfg.seq,
                   " is longer than the model's context of ", mcfg.block_size, " positions");
  // The training objective's coefficients come from the flags (like dropout), also when resuming.
  mcfg.moe.aux_loss = cfg.moe_aux_loss;
  mcfg.moe.z_loss = cfg.moe_z_loss;
  nn::validate(mcfg);
  check_tensor_parallel(mcfg, cfg.tp);
  // Ulysses splits each tensor-parallel rank's heads over the cp ranks.
  nn::check_context_heads(
      cfg.cp_comm, cfg.cp,
      kernels::AttentionHeads{mcfg.n_head / cfg.tp, mcfg.kv_heads() / cfg.tp, mcfg.head_dim()});
  TESSERA_CHECK_AS(ConfigError, cfg.ep == 1 || mcfg.moe.experts > 0, config_key("ep"), " ", cfg.ep,
                   " needs a mixture-of-experts model, but the model has no experts");
  TESSERA_CHECK_AS(ConfigError, mcfg.moe.experts % cfg.ep == 0, "the model's ", mcfg.moe.experts,
                   " experts do not split over ", config_key("ep"), " ", cfg.ep,
                   " ranks; choose ep dividing the expert count");
  plan.split = data::split_train_val(plan.pd.tokens->size(), cfg.val_fraction, cfg.seq + 1);
  plan.unigram_entropy =
      data::unigram_entropy(*plan.pd.tokens, plan.split.train.begin, plan.split.train.end);
  return plan;
}

// --bf16-gemm resolved once per process before the ranks start (under mpirun, by rank 0 for all),
// so that every rank runs the same path: auto measures the two (kernels/precision.h), except
// that a resumed run keeps the path its checkpoint ran where this machine has it, so that it
// continues bitwise.
void choose_bf16_gemm(const TrainConfig& cfg, RunPlan& plan) {
  if (cfg.precision != kernels::Precision::BF16) return;  // the path is never used
  const kernels::Bf16Gemm requested = cfg.bf16_gemm;
  if (requested == kernels::Bf16Gemm::Auto && plan.ckpt &&
      plan.ckpt->state.contains("bf16_gemm_path")) {
    const nlohmann::json& v = plan.ckpt->state.at("bf16_gemm_path");
    TESSERA_CHECK_AS(
        IoError, v == "onednn" || v == "emulated", "checkpoint '", plan.ckpt->dir.string(),
        "': state.json's 'bf16_gemm_path' must be \"onednn\" or \"emulated\", got ", v.dump());
    const kernels::Bf16Gemm saved = kernels::parse_bf16_gemm(v.get<std::string>());
    if (saved == kernels::Bf16Gemm::Emulated || kernels::onednn_bf16_usable()) {
      plan.bf16_gemm = saved;
      plan.bf16_gemm_chosen_by = "--bf16-gemm auto: the path of the run resumed";
      return;
    }
  }
  plan.bf16_gemm = kernels::resolve_bf16_gemm(requested);
}

void choose_peak(const TrainConfig& cfg, RunPlan& plan, bool reported) {
  if (cfg.peak_gflops > 0) {
    plan.peak_flops_per_rank = cfg.peak_gflops * 1e9;
    plan.peak_source = "--peak-gflops";
    return;
  }
  if (!reported) return;
  const kernels::GemmModeScope mode({cfg.precision, plan.bf16_gemm});
  constexpr int n = 1024;
  const double core = kernels::measure_core_gemm_peak(n);
  plan.peak_flops_per_rank = core * plan.threads;
  plan.peak_source = detail::concat("measured: one core's best ", n, "^3 ",
                                    kernels::to_string(cfg.precision), " GEMM in CPU time x ",
                                    plan.threads, plan.threads == 1 ? " thread" : " threads");
}

}  // namespace tessera::train
