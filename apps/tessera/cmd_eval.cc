// `tessera eval`: mean cross-entropy per token (nats) of weights over data, on consecutive
// non-overlapping windows of --seq tokens (the last partial window dropped).
#include <cmath>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "model_loading.h"
#include "tessera/core/error.h"
#include "tessera/data/eval_windows.h"
#include "tessera/data/prepare.h"
#include "tessera/train/model_io.h"
#include "tessera/train/trainer.h"

namespace tessera::app {
namespace {

struct EvalFlags {
  std::string weights, data, tokenizer;
  int seq = 0, batch = 8, heads = 0, threads = 0;
  std::string precision = "fp32", bf16_gemm = "auto";
  int64_t max_windows = 0;
};

void run(const EvalFlags& f, int& exit_code) {
  train::set_compute_threads(f.threads);
  train::LoadedModel m = train::load_model(f.weights, f.heads, f.tokenizer, f.batch,
                                           gemm_mode_from_flags(f.precision, f.bf16_gemm));
  const nn::GPTConfig& mc = m.model->config();
  int seq = f.seq > 0 ? f.seq : mc.block_size;
  TESSERA_CHECK_AS(ConfigError, seq <= mc.block_size, "--seq ", seq,
                   " is longer than the model's context of ", mc.block_size);
  data::DataOptions dopt;
  dopt.data = f.data;
  dopt.vocab_size = mc.vocab_size;
  dopt.tokenizer = m.tokenizer_path;
  dopt.cache_dir = "";
  data::PreparedData pd = data::prepare_data(dopt);
  TESSERA_CHECK_AS(ConfigError, pd.vocab_size <= mc.vocab_size, "the data uses token ids up to ",
                   pd.vocab_size - 1, " but the model's vocabulary has ", mc.vocab_size);
  data::EvalWindows windows(pd.tokens, data::TokenRange{0, pd.tokens->size()}, seq);
  int64_t n = windows.num_windows();
  if (f.max_windows > 0) n = std::min(n, f.max_windows);
  TESSERA_CHECK_AS(ConfigError, n > 0, "the data has ", pd.tokens->size(),
                   " tokens: fewer than one window of --seq ", seq, " + 1");
  std::vector<int32_t> in(static_cast<size_t>(f.batch) * seq), tgt(in.size());
  double sum = 0;
  int64_t tokens = 0;
  for (int64_t first = 0; first < n; first += f.batch) {
    int64_t rows = std::min<int64_t>(f.batch, n - first);
    windows.fetch(first, rows, in.data(), tgt.data());
    nn::Batch b{in.data(), tgt.data(), static_cast<int>(rows), seq, 0};
    sum += m.model->forward(b, nn::StepContext{0, 0, false, 1.0f});
    tokens += rows * seq;
  }
  double mean = sum / static_cast<double>(tokens);
  std::printf("windows %lld | tokens %lld | loss %.6f nats/token | perplexity %.3f\n",
              static_cast<long long>(n), static_cast<long long>(tokens), mean, std::exp(mean));
  exit_code = 0;
}

}  // namespace

void register_eval(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<EvalFlags>();
  CLI::App* cmd = root.add_subcommand(
      "eval",
      "Mean cross-entropy per token (nats) of weights over data, on consecutive "
      "non-overlapping windows of --seq tokens");
  cmd->add_option("--weights", f->weights, "model.safetensors, or a directory holding it")
      ->required();
  cmd->add_option("--data", f->data,
                  "Text, tessera token file, or raw uint16 .bin; empty: the default corpus");
  cmd->add_option("--tokenizer", f->tokenizer,
                  "tokenizer.json or tokenizer.model (default: the one beside the weights)");
  cmd->add_option("--seq", f->seq, "Window length (default: the model's context)");
  cmd->add_option("--batch", f->batch, "Windows per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--heads", f->heads, "Attention heads when no config.json is beside the weights");
  cmd->add_option("--max-windows", f->max_windows, "Evaluate at most this many windows (0: all)");
  cmd->add_option("--threads", f->threads, "Compute threads (0: one per core)");
  cmd->add_option("--precision", f->precision,
                  "GEMM precision: fp32, or bf16 (bf16 inputs, fp32 accumulation)")
      ->capture_default_str();
  cmd->add_option("--bf16-gemm", f->bf16_gemm, "bf16 GEMM path: auto, onednn or emulated")
      ->capture_default_str();
  cmd->callback([f, &exit_code]() { run(*f, exit_code); });
}

}  // namespace tessera::app
