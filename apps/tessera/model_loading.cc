#include "model_loading.h"

#include <cstdio>

#include "tessera/core/error.h"
#include "tessera/data/load_tokenizer.h"
#include "tessera/train/model_io.h"

namespace tessera::app {

kernels::GemmMode gemm_mode_from_flags(const std::string& precision, const std::string& bf16_gemm) {
  const kernels::Bf16Gemm requested = kernels::parse_bf16_gemm(bf16_gemm);
  kernels::GemmMode m{kernels::parse_precision(precision), requested};
  if (m.precision == kernels::Precision::BF16) {
    m.bf16 = kernels::resolve_bf16_gemm(requested);
    std::fprintf(stderr, "precision: bf16, %s\n", kernels::describe(m, requested).c_str());
  }
  return m;
}

LoadedModel load_model(const std::string& weights, int heads, const std::string& tokenizer,
                       int max_batch, const kernels::GemmMode& gemm) {
  LoadedModel m;
  std::filesystem::path file = train::weights_file(weights);
  io::HfGptConfig hc =
      train::config_of_weights(weights, heads > 0 ? std::optional<int>(heads) : std::nullopt);
  m.alloc = std::make_unique<Allocator>("rank 0");
  nn::GPTLayout layout;
  layout.gemm = gemm;
  m.model = std::make_unique<nn::GPT>(train::from_hf_config(hc, 0.0f), max_batch, *m.alloc, layout);
  train::load_weights(*m.model, train::open_weights(weights));
  // The one given, else a SentencePiece tokenizer.model beside the weights (load_tokenizer picks
  // it from the folder), else a tokenizer.json there.
  const std::filesystem::path folder = file.parent_path();
  std::filesystem::path tok = tokenizer;
  if (tokenizer.empty())
    tok = std::filesystem::exists(folder / "tokenizer.model") ? folder : folder / "tokenizer.json";
  if (!tokenizer.empty() || std::filesystem::exists(tok)) {
    m.tokenizer = data::load_tokenizer(tok);
    m.tokenizer_path = tok;
    TESSERA_CHECK_AS(ConfigError, m.tokenizer->vocab_size() <= hc.vocab_size, "tokenizer '",
                     tok.string(), "' has ", m.tokenizer->vocab_size(),
                     " tokens but the model only ", hc.vocab_size);
  }
  return m;
}

}  // namespace tessera::app
