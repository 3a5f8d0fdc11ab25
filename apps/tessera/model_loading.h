// Shared by `eval` and `sample`: a GPT and its tokenizer from --weights.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "tessera/data/bpe_tokenizer.h"
#include "tessera/nn/gpt.h"

namespace tessera::app {

struct LoadedModel {
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<nn::GPT> model;
  std::optional<data::BpeTokenizer> tokenizer;  // --tokenizer, or tokenizer.json beside the weights
  std::optional<std::filesystem::path> tokenizer_path;
};

// heads: 0 = from config.json beside the weights. tokenizer: "" = beside the weights, if any.
LoadedModel load_model(const std::string& weights, int heads, const std::string& tokenizer,
                       int max_batch);

}  // namespace tessera::app
