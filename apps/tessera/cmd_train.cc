// `tessera train`: every TrainConfig key is a flag (`--grad-clip`) and a JSON config key
// (`grad_clip`). Precedence, lowest first: defaults, the resumed checkpoint's config, --config
// FILE, flags given on the command line.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/checkpoint.h"
#include "tessera/train/metrics.h"
#include "tessera/train/stop_request.h"
#include "tessera/train/trainer.h"

namespace tessera::app {
namespace {

struct TrainFlags {
  train::TrainConfig values;
  std::string config_file;
  std::map<std::string, CLI::Option*> options;  // JSON key -> option
};

template <typename T>
CLI::Option* flag(CLI::App* cmd, TrainFlags& f, const std::string& key, T& field,
                  const std::string& help) {
  std::string name = "--" + key;
  for (char& c : name)
    if (c == '_') c = '-';
  return f.options[key] = cmd->add_option(name, field, help)
                              ->capture_default_str()
                              ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

// A boolean key given as a bare flag: `--sp` (or `--sp=false`).
CLI::Option* switch_flag(CLI::App* cmd, TrainFlags& f, const std::string& key, bool& field,
                         const std::string& help) {
  std::string name = "--" + key;
  for (char& c : name)
    if (c == '_') c = '-';
  return f.options[key] = cmd->add_flag(name, field, help);
}

// How the run stopped, and the command that continues it.
void report_stop(const train::TrainConfig& cfg, const train::TrainResult& r) {
  std::fflush(stdout);
  std::string how = detail::concat("tessera: stopped by ", train::signal_name(r.stopped_by),
                                   " after step ", r.steps, " of ", cfg.steps);
  if (cfg.save.empty()) {
    std::fprintf(stderr, "%s; nothing was saved (no --save was given), so it cannot be resumed\n",
                 how.c_str());
    return;
  }
  std::string launcher;
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && comm::launched_by_mpi())
    launcher = detail::concat("mpirun -np ", n, " ");
  std::fprintf(stderr, "%s; saved checkpoint %s. Resume with:\n  %s%s train --resume %s\n",
               how.c_str(), r.checkpoint.c_str(), launcher.c_str(), program_path(),
               cfg.save.c_str());
}

void run(TrainFlags& f, int& exit_code) {
  nlohmann::json merged = train::to_json(train::TrainConfig{});
  auto overlay = [&](const nlohmann::json& j) {
    for (const auto& [k, v] : j.items()) merged[k] = v;
  };
  const train::TrainConfig& given = f.values;
  nlohmann::json given_json = train::to_json(given);
  std::string resume = f.options["resume"]->count() ? given.resume : "";
  if (!f.config_file.empty()) {
    nlohmann::json file = train::read_json_file(f.config_file);
    train::train_config_from_json(file);  // reject unknown keys and wrong types early
    if (resume.empty() && file.contains("resume")) resume = file["resume"].get<std::string>();
  }
  if (!resume.empty()) {
    // Only its saved config is needed here; the trainer verifies the checksums when it loads.
    io::LoadedCheckpoint c = io::load_checkpoint(resume, {.verify_checksums = false});
    if (c.state.contains("config")) overlay(c.state["config"]);
  }
  if (!f.config_file.empty()) overlay(train::read_json_file(f.config_file));
  for (const auto& [key, opt] : f.options)
    if (opt->count() > 0) merged[key] = given_json[key];
  merged["resume"] = resume;
  train::TrainConfig cfg = train::train_config_from_json(merged);
  // Fail before any work when the results could not be written (docs/RELIABILITY.md).
  if (!cfg.save.empty()) io::check_writable_directory(cfg.save);
  if (!cfg.metrics.empty()) {
    train::MetricsWriter probe(cfg.metrics, /*append=*/true);
  }
  train::TrainResult r;
  {
    // SIGINT / SIGTERM stop the run cleanly after the current step (docs/RELIABILITY.md).
    const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    train::StopSignals signals(/*announce=*/world_rank == nullptr ||
                               std::string(world_rank) == "0");
    r = train::run_training(cfg, stdout);
  }
  exit_code = 0;
  if (r.stopped_by) {
    exit_code = 128 + r.stopped_by;  // as the shell reports a process ended by the signal
    if (r.rank == 0) report_stop(cfg, r);
    return;
  }
  if (r.rank != 0) return;  // under mpirun, rank 0 reports
  if (r.last_val_loss >= 0)
    std::printf("done: %lld steps, final val_loss %.4f (unigram entropy %.4f), %.0f tokens/s\n",
                static_cast<long long>(r.steps), r.last_val_loss, r.unigram_entropy,
                r.tokens_per_s);
  else
    std::printf("done: %lld steps, %.0f tokens/s\n", static_cast<long long>(r.steps),
                r.tokens_per_s);
}

}  // namespace

void register_train(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<TrainFlags>();
  train::TrainConfig& v = f->values;
  CLI::App* cmd = root.add_subcommand(
      "train", "Train a GPT. With no flags: a small GPT-2 on Debian's fortunes corpus.");
  cmd->add_option("--config", f->config_file,
                  "JSON file with any of the keys below (flag names with '_' for '-'); flags "
                  "given on the command line win")
      ->check(CLI::ExistingFile);
  flag(cmd, *f, "data", v.data,
       "Text file or directory, tessera token file, or raw uint16 .bin (nanoGPT); empty: Debian's "
       "fortunes");
  flag(cmd, *f, "vocab", v.vocab, "BPE vocabulary size to train on text data");
  flag(cmd, *f, "val_fraction", v.val_fraction,
       "Fraction of tokens held out for validation (0 disables)");
  flag(cmd, *f, "cache_dir", v.cache_dir,
       "Where tokenizers and token files prepared from text are cached");
  flag(cmd, *f, "layers", v.layers, "Transformer blocks");
  flag(cmd, *f, "dim", v.dim, "Model width (embedding size)");
  flag(cmd, *f, "heads", v.heads,
       "Attention heads (must divide --dim); 0: 4 for a new model, from config.json beside "
       "--init-from weights");
  flag(cmd, *f, "seq", v.seq, "Sequence length (tokens per sample; the model's context)");
  flag(cmd, *f, "dropout", v.dropout, "Dropout probability");
  flag(cmd, *f, "init_from", v.init_from,
       "Start from these safetensors weights (HF GPT-2 names); the architecture comes from them");
  flag(cmd, *f, "moe_experts", v.moe_experts,
       "Mixture of experts: experts per MoE block (each a GPT-2 MLP); 0 = dense MLPs");
  flag(cmd, *f, "moe_top_k", v.moe_top_k,
       "Experts per token (gates renormalised over them); ties go to the lower expert index");
  flag(cmd, *f, "moe_every", v.moe_every,
       "Block l (0-based) is an MoE block when l % every == every - 1 (1: every block)");
  flag(cmd, *f, "moe_capacity_factor", v.moe_capacity_factor,
       "Per-sequence expert capacity ceil(factor x top_k x seq / experts); 0 = dropless");
  flag(cmd, *f, "moe_aux_loss", v.moe_aux_loss,
       "Switch load-balancing loss coefficient (alpha E sum_i f_i P_i, per sequence)");
  flag(cmd, *f, "moe_z_loss", v.moe_z_loss, "Router z-loss coefficient (mean logsumexp^2)");
  flag(cmd, *f, "steps", v.steps, "Optimizer steps (the total, also when resuming)");
  flag(cmd, *f, "batch", v.batch, "Global batch size in sequences");
  flag(cmd, *f, "micro_batch", v.micro_batch,
       "Sequences per forward/backward (gradient accumulation); 0 = --batch");
  flag(cmd, *f, "lr", v.lr, "Peak learning rate");
  flag(cmd, *f, "warmup", v.warmup, "Linear warmup steps (then cosine decay)");
  flag(cmd, *f, "min_lr_ratio", v.min_lr_ratio, "Final learning rate as a fraction of --lr");
  flag(cmd, *f, "weight_decay", v.weight_decay, "Decoupled weight decay (2-D weights only)");
  flag(cmd, *f, "grad_clip", v.grad_clip, "Clip the global gradient norm to this (0 disables)");
  flag(cmd, *f, "optimizer", v.optimizer, "adamw or sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  flag(cmd, *f, "momentum", v.momentum, "SGD momentum");
  flag(cmd, *f, "beta1", v.beta1, "AdamW beta1");
  flag(cmd, *f, "beta2", v.beta2, "AdamW beta2");
  flag(cmd, *f, "seed", v.seed, "Seed of initialisation, data order, dropout and sampling");
  flag(cmd, *f, "dp", v.dp,
       "Data-parallel ranks (replicas): threads of this process, or under mpirun processes "
       "(mpirun starts pp x dp x tp)");
  flag(cmd, *f, "tp", v.tp,
       "Tensor-parallel ranks per replica (Megatron split; vocabulary-parallel embedding and "
       "loss); the job has dp x tp ranks: threads, or under mpirun the number of processes");
  switch_flag(cmd, *f, "sp", v.sp,
              "Sequence parallelism (needs --tp 2 or more): LayerNorms and dropout on each "
              "tensor-parallel rank's slice of the tokens; all-gather / reduce-scatter instead of "
              "all-reduce");
  flag(cmd, *f, "pp", v.pp,
       "Pipeline stages (ranks); the job has pp x dp x tp ranks (tp fastest, then dp, then pp)");
  flag(cmd, *f, "ep", v.ep,
       "Expert-parallel ranks: each MoE block's experts split over ep ranks carved from --dp "
       "(ep must divide dp and the expert count)");
  flag(cmd, *f, "pp_split", v.pp_split,
       "Units per model stage, e.g. 4,4 for 6 blocks (the embedding and the head count as units; "
       "a block's attention and MLP halves 0.5 each, so 4.5,3.5 cuts inside block 3); "
       "empty = balanced by modelled cost at half-block grain");
  flag(cmd, *f, "schedule", v.schedule, "Pipeline schedule: gpipe, 1f1b, interleaved or zb-h1")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1"}));
  flag(cmd, *f, "virtual_stages", v.virtual_stages,
       "Model chunks per pipeline rank (the interleaved schedule)");
  flag(cmd, *f, "zero", v.zero,
       "ZeRO stage: 0 (plain DP), 1 (shard optimizer state), 2 (+ gradients), 3 (+ parameters)")
      ->check(CLI::Range(0, 3));
  flag(cmd, *f, "bucket_mb", v.bucket_mb,
       "Gradient bucket size in MiB (communication granularity)");
  flag(cmd, *f, "overlap", v.overlap, "Overlap gradient communication with backward (true/false)");
  flag(cmd, *f, "recompute", v.recompute,
       "Activation recomputation: none, selective (attention scores) or full (whole blocks)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  flag(cmd, *f, "precision", v.precision,
       "GEMM precision: fp32, or bf16 (bf16 inputs, fp32 accumulation; fp32 master weights, "
       "gradients, optimizer state, LayerNorm, softmax, loss and router)");
  flag(cmd, *f, "bf16_gemm", v.bf16_gemm,
       "bf16 GEMM path: auto (the faster of the two, measured at start; emulated on a CPU without "
       "avx512_bf16 or amx_bf16), onednn, emulated (bf16-rounded inputs through OpenBLAS)");
  flag(cmd, *f, "bf16_weight_copies", v.bf16_weight_copies,
       "bf16 copies of the GEMM weights, converted once per forward rather than at every GEMM "
       "(2 bytes per weight; not under ZeRO-3): auto (on where the GEMMs run through oneDNN), on, "
       "off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  flag(cmd, *f, "grad_reduce_dtype", v.grad_reduce_dtype,
       "Data-parallel gradient reduction in fp32 or bf16 (half the bytes; fp32 accumulation)");
  flag(cmd, *f, "param_gather_dtype", v.param_gather_dtype,
       "ZeRO-3 parameter all-gathers in auto (= --precision), fp32 or bf16 (each rank rounds its "
       "fp32 master shard: half the bytes; the model reads the bf16 values)");
  flag(cmd, *f, "activation_comm_dtype", v.activation_comm_dtype,
       "Tensor- and pipeline-parallel activations and their gradients sent in auto (= "
       "--precision), fp32 or bf16 (rounded to send, widened on arrival: half the bytes)");
  flag(cmd, *f, "export_dtype", v.export_dtype,
       "model.safetensors in fp32 or bf16 (checkpoints always hold the fp32 masters)");
  flag(cmd, *f, "peak_gflops", v.peak_gflops,
       "One rank's GEMM peak in GFLOP/s for the precision in use, for the progress line's MFU; "
       "0 = measured at start (a 1024^3 GEMM on the rank's threads)");
  flag(cmd, *f, "comm_timeout", v.comm_timeout,
       "Seconds a rank waits for its peers in any communication call before the run fails with "
       "an error naming the call (0: TESSERA_COMM_TIMEOUT_S, else 300)");
  flag(cmd, *f, "io_timeout", v.io_timeout,
       "Seconds the other ranks wait while rank 0 writes a checkpoint (or, under mpirun, prepares "
       "the data and reads the checkpoint) before the run fails; never below --comm-timeout");
  flag(cmd, *f, "backend", v.backend,
       "Communication backend: auto (mpi under mpirun, else inproc), inproc, mpi")
      ->check(CLI::IsMember({"auto", "inproc", "mpi"}));
  flag(cmd, *f, "trace", v.trace,
       "Write the timeline (Chrome trace-event JSON, one track per rank) to this file");
  flag(cmd, *f, "threads", v.threads,
       "Compute (BLAS) threads per rank; 0 = the cores divided among the ranks");
  flag(cmd, *f, "memory_limit", v.memory_limit,
       "Emulated device memory per rank, e.g. 2GiB (empty: unlimited)");
  flag(cmd, *f, "save", v.save,
       "Checkpoint directory (also exports model.safetensors, config.json, tokenizer.json)");
  flag(cmd, *f, "resume", v.resume, "Resume from this checkpoint directory");
  flag(cmd, *f, "save_every", v.save_every, "Save a checkpoint every N steps (0: only at the end)");
  flag(cmd, *f, "metrics", v.metrics, "Write metrics as JSON lines to this file");
  flag(cmd, *f, "eval_every", v.eval_every, "Validate every N steps (0: only at the end)");
  flag(cmd, *f, "eval_batches", v.eval_batches,
       "Validation batches of --batch sequences (the same windows in every layout)");
  flag(cmd, *f, "sample_tokens", v.sample_tokens, "Tokens to generate at the end (0: none)");
  flag(cmd, *f, "prompt", v.prompt, "Prompt of the final sample");
  flag(cmd, *f, "temperature", v.temperature, "Sampling temperature");
  flag(cmd, *f, "top_k", v.top_k, "Sample from the k most likely tokens (0: all)");
  flag(cmd, *f, "log_every", v.log_every, "Progress line every N steps when not on a terminal");
  cmd->callback([f, &exit_code]() { run(*f, exit_code); });
}

}  // namespace tessera::app
