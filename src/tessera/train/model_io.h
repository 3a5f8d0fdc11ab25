// Moving a GPT's weights to and from files: Hugging Face GPT-2 safetensors plus config.json, and
// the model configuration that weights determine.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "tessera/core/allocator.h"
#include "tessera/data/tokenizer.h"
#include "tessera/io/hf_config.h"
#include "tessera/io/safetensors.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/gpt.h"

namespace tessera::train {

io::HfGptConfig to_hf_config(const nn::GPTConfig& c);
nn::GPTConfig from_hf_config(const io::HfGptConfig& c, float dropout);

// The configuration of the weights at `weights` (a .safetensors file or a directory holding
// model.safetensors): from config.json beside them when present, else from the tensor shapes,
// with the head count from `heads` (which must divide the width). Throws ConfigError / IoError.
io::HfGptConfig config_of_weights(const std::filesystem::path& weights, std::optional<int> heads);
// `weights` itself when it is a file; in a directory its model.safetensors, or, when it has none,
// its model.safetensors.index.json (Hugging Face's sharded layout).
std::filesystem::path weights_file(const std::filesystem::path& weights);
// The weights at `weights` (a file, an index of shards, or a directory holding either), opened.
// ConfigError when there are none; IoError naming a missing shard or a damaged file.
io::SafetensorsFile open_weights(const std::filesystem::path& weights);

// Copies every parameter from the file into the model (names, shapes checked; "transformer."
// prefix and the tied lm_head.weight accepted), and the MoE layers' selection biases the file
// holds (train/moe_bias.h). Throws IoError naming the problem.
void load_weights(nn::GPT& model, const io::SafetensorsFile& file);
// The model's parameters under their Hugging Face names (views, no copy).
io::NamedTensors named_weights(nn::GPT& model);
// Writes DIR/model.safetensors (the full `weights`, fp32, or rounded to bf16 with dtype BF16:
// round to nearest even) and DIR/config.json, each atomically; with max_shard_bytes > 0, Hugging
// Face's shards of at most that many bytes and model.safetensors.index.json instead (one
// model.safetensors when everything fits: io::save_safetensors_sharded).
void export_weights(const io::NamedTensors& weights, const nn::GPTConfig& config,
                    const std::filesystem::path& dir, DType dtype = DType::F32,
                    uint64_t max_shard_bytes = 0);

// A GPT and its tokenizer, loaded from weights for inference (`tessera eval`, `tessera sample`,
// the Python package's tessera.load).
struct LoadedModel {
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<nn::GPT> model;
  // The tokenizer given, or the one beside the weights (tokenizer.json or tokenizer.model, of any
  // format data::load_tokenizer reads), or null.
  std::shared_ptr<const data::Tokenizer> tokenizer;
  std::optional<std::filesystem::path> tokenizer_path;
};

// The model at `weights` (what config_of_weights and open_weights accept) with room for batches of
// up to `max_batch` sequences. heads: 0 = from config.json beside the weights. tokenizer: "" = the
// one beside the weights, if any (ConfigError when it has more tokens than the model). gemm: the
// model's GEMM precision (the weights are fp32 in memory either way).
LoadedModel load_model(const std::filesystem::path& weights, int heads,
                       const std::filesystem::path& tokenizer, int max_batch,
                       const kernels::GemmMode& gemm = {});

}  // namespace tessera::train
