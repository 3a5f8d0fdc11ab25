// Shared by `eval` and `sample`: a GPT and its tokenizer from --weights.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "tessera/data/tokenizer.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/gpt.h"

namespace tessera::app {

struct LoadedModel {
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<nn::GPT> model;
  // --tokenizer, or the tokenizer beside the weights (tokenizer.json or tokenizer.model, of any
  // format data::load_tokenizer reads), or null.
  std::shared_ptr<const data::Tokenizer> tokenizer;
  std::optional<std::filesystem::path> tokenizer_path;
};

// heads: 0 = from config.json beside the weights. tokenizer: "" = beside the weights, if any.
// gemm: the model's GEMM precision (the weights are fp32 in memory either way).
LoadedModel load_model(const std::string& weights, int heads, const std::string& tokenizer,
                       int max_batch, const kernels::GemmMode& gemm = {});

// --precision and --bf16-gemm of eval and sample, parsed (ConfigError naming the accepted values).
// Under bf16 says on stderr which GEMM path the model uses.
kernels::GemmMode gemm_mode_from_flags(const std::string& precision, const std::string& bf16_gemm);

}  // namespace tessera::app
