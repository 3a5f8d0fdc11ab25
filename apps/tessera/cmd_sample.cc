// `tessera sample`: generate text from weights with temperature and top-k.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "model_loading.h"
#include "tessera/core/error.h"
#include "tessera/train/generate.h"
#include "tessera/train/model_io.h"
#include "tessera/train/trainer.h"

namespace tessera::app {
namespace {

struct SampleFlags {
  std::string weights, tokenizer, prompt = "\n";
  int tokens = 200, top_k = 40, heads = 0, threads = 0;
  std::string precision = "fp32", bf16_gemm = "auto";
  float temperature = 0.8f;
  uint64_t seed = 0;
  bool kv_cache = true;
};

// The generation's speed, on stderr (stdout holds the text): the prompt's prefill and the tokens
// drawn after the first, each in tokens per second.
void print_speed(const train::SampleStats& s) {
  auto rate = [](double tokens, double seconds) { return seconds > 0 ? tokens / seconds : 0.0; };
  std::fprintf(stderr,
               "prefill: %lld tokens in %.3f s (%.1f tokens/s) | decode: %lld tokens in %.3f s "
               "(%.1f tokens/s) | %s\n",
               static_cast<long long>(s.prefill_tokens), s.prefill_seconds,
               rate(static_cast<double>(s.prefill_tokens), s.prefill_seconds),
               static_cast<long long>(s.decode_tokens), s.decode_seconds,
               rate(static_cast<double>(s.decode_tokens), s.decode_seconds),
               s.kv_cache ? "key/value cache" : "full forward per token");
}

void run(const SampleFlags& f, int& exit_code) {
  train::set_compute_threads(f.threads);
  train::LoadedModel m = train::load_model(f.weights, f.heads, f.tokenizer, 1,
                                           gemm_mode_from_flags(f.precision, f.bf16_gemm));
  TESSERA_CHECK_AS(ConfigError, m.tokenizer != nullptr,
                   "sampling text needs a tokenizer: none is beside the weights; pass --tokenizer");
  // With the ids the tokenizer puts before a sequence (Llama 3's <|begin_of_text|>, BOS).
  std::vector<uint32_t> p = m.tokenizer->encode_with_special_tokens(f.prompt);
  std::vector<int32_t> prompt(p.begin(), p.end());
  TESSERA_CHECK_AS(ConfigError, !prompt.empty(), "--prompt is empty");
  std::fputs(f.prompt.c_str(), stdout);
  train::SampleOptions so{f.tokens, f.temperature, f.top_k, f.seed, f.kv_cache};
  train::SampleStats stats;
  // Streamed as the text of all new ids grows: a piece decoded alone can lose what joins it to
  // the one before (SentencePiece's word-initial spaces).
  std::vector<uint32_t> out;
  std::string shown;
  train::generate(
      *m.model, prompt, so,
      [&](int32_t t) {
        out.push_back(static_cast<uint32_t>(t));
        const std::string text = m.tokenizer->decode(out);
        if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0)
          std::fputs(text.c_str() + shown.size(), stdout);
        else if (text != shown)
          std::fputs(("\n" + text).c_str(), stdout);  // the text changed before: show it whole
        shown = text;
        std::fflush(stdout);
      },
      &stats);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  print_speed(stats);
  exit_code = 0;
}

}  // namespace

void register_sample(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<SampleFlags>();
  CLI::App* cmd = root.add_subcommand("sample", "Generate text from trained weights");
  cmd->add_option("--weights", f->weights, "model.safetensors, or a directory holding it")
      ->required();
  cmd->add_option("--tokenizer", f->tokenizer,
                  "tokenizer.json or tokenizer.model (default: the one beside the weights)");
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
  cmd->add_option("--kv-cache", f->kv_cache,
                  "Generate with a key/value cache (false: the full forward of the context for "
                  "every token, as a model split over ranks does)")
      ->capture_default_str();
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
