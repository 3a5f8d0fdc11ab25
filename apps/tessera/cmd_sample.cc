// `tessera sample`: generate text from weights with temperature and top-k.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "model_loading.h"
#include "tessera/core/error.h"
#include "tessera/train/generate.h"
#include "tessera/train/trainer.h"

namespace tessera::app {
namespace {

struct SampleFlags {
  std::string weights, tokenizer, prompt = "\n";
  int tokens = 200, top_k = 40, heads = 0, threads = 0;
  std::string precision = "fp32", bf16_gemm = "auto";
  float temperature = 0.8f;
  uint64_t seed = 0;
};

void run(const SampleFlags& f, int& exit_code) {
  train::set_compute_threads(f.threads);
  LoadedModel m = load_model(f.weights, f.heads, f.tokenizer, 1,
                             gemm_mode_from_flags(f.precision, f.bf16_gemm));
  TESSERA_CHECK_AS(ConfigError, m.tokenizer.has_value(),
                   "sampling text needs a tokenizer: none is beside the weights; pass --tokenizer");
  std::vector<uint32_t> p = m.tokenizer->encode(f.prompt);
  std::vector<int32_t> prompt(p.begin(), p.end());
  TESSERA_CHECK_AS(ConfigError, !prompt.empty(), "--prompt is empty");
  std::fputs(f.prompt.c_str(), stdout);
  train::SampleOptions so{f.tokens, f.temperature, f.top_k, f.seed};
  train::generate(*m.model, prompt, so, [&](int32_t t) {
    uint32_t id = static_cast<uint32_t>(t);
    std::string s = m.tokenizer->decode(std::span<const uint32_t>(&id, 1));
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
  });
  std::fputs("\n", stdout);
  exit_code = 0;
}

}  // namespace

void register_sample(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<SampleFlags>();
  CLI::App* cmd = root.add_subcommand("sample", "Generate text from trained weights");
  cmd->add_option("--weights", f->weights, "model.safetensors, or a directory holding it")
      ->required();
  cmd->add_option("--tokenizer", f->tokenizer,
                  "tokenizer.json (default: the one beside the weights)");
  cmd->add_option("--prompt", f->prompt, "Text to continue")->capture_default_str();
  cmd->add_option("--tokens", f->tokens, "Tokens to generate")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--temperature", f->temperature, "Sampling temperature (> 0)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "Random seed")->capture_default_str();
  cmd->add_option("--heads", f->heads, "Attention heads when no config.json is beside the weights");
  cmd->add_option("--threads", f->threads, "Compute threads (0: one per core)");
  cmd->add_option("--precision", f->precision,
                  "GEMM precision: fp32, or bf16 (bf16 inputs, fp32 accumulation)")
      ->capture_default_str();
  cmd->add_option("--bf16-gemm", f->bf16_gemm, "bf16 GEMM path: auto, onednn or emulated")
      ->capture_default_str();
  cmd->callback([f, &exit_code]() { run(*f, exit_code); });
}

}  // namespace tessera::app
