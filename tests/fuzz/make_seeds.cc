// Writes seed inputs for every fuzz target, made by tessera's own writers:
//   make_seeds OUT_DIR   ->   OUT_DIR/<target>/seed-*
// scripts/fuzz.sh runs it and merges the seeds into tests/fuzz/corpus/<target>/ (a merge keeps
// only inputs that add coverage). Every file is the same bytes on every run.
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint_fixture.h"
#include "tessera/core/tensor.h"
#include "tessera/data/bpe_tokenizer.h"
#include "tessera/data/token_file.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/hf_config.h"
#include "tessera/io/safetensors.h"
#include "tessera/train/train_config.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

void put(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

Tensor ramp(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* b = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<unsigned char>(i * 37 + 11);
  return t;
}

void safetensors_seeds(const fs::path& out) {
  fs::create_directories(out);
  // A tiny GPT-2 as tessera saves it (with the "format" metadata Hugging Face expects).
  io::HfGptConfig c{.n_layer = 1, .n_head = 1, .n_embd = 2, .n_positions = 2, .vocab_size = 3};
  io::NamedTensors gpt;
  for (const io::ExpectedTensor& e : io::gpt2_expected_tensors(c))
    gpt.emplace_back(e.name, ramp(e.shape, DType::F32));
  io::save_safetensors(out / "seed-gpt2.safetensors", gpt, {{"format", "pt"}});
  // Every supported dtype, an empty tensor and a scalar.
  io::save_safetensors(out / "seed-dtypes.safetensors", {{"bf16", ramp({2, 3}, DType::BF16)},
                                                         {"empty", ramp({0, 4}, DType::F32)},
                                                         {"f16", ramp({3}, DType::F16)},
                                                         {"f32", ramp({2, 2}, DType::F32)},
                                                         {"i32", ramp({2}, DType::I32)},
                                                         {"i64", ramp({1}, DType::I64)},
                                                         {"scalar", ramp({}, DType::F32)},
                                                         {"u16", ramp({2}, DType::U16)},
                                                         {"u8", ramp({5}, DType::U8)}});
  io::save_safetensors(out / "seed-none.safetensors", {});
}

// Indexes naming the shards fuzz_safetensors_index.cc keeps beside them.
void safetensors_index_seeds(const fs::path& out, const fs::path& scratch) {
  fs::create_directories(out);
  const fs::path model = scratch / "sharded";
  io::save_safetensors_sharded(
      model,
      {{"a", ramp({2}, DType::F32)}, {"b", ramp({3}, DType::BF16)}, {"c", ramp({2}, DType::F16)}},
      14, {{"format", "pt"}});
  put(out / "seed-tessera.json", io::read_file(model / io::kSafetensorsIndexFile));
  // As transformers writes it (total_parameters, a stale copy of "a" in the second shard
  // ignored), and the smallest index there is.
  put(out / "seed-hf.json",
      "{\n  \"metadata\": {\n    \"total_parameters\": 7,\n    \"total_size\": 18\n  },\n"
      "  \"weight_map\": {\n    \"a\": \"model-00001-of-00002.safetensors\",\n"
      "    \"c\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");
  put(out / "seed-empty.json", R"({"weight_map": {}})");
}

void hf_config_seeds(const fs::path& out) {
  fs::create_directories(out);
  io::write_hf_config(out / "seed-gpt2.json", io::HfGptConfig{});
  io::write_hf_config(out / "seed-small.json", {.n_layer = 2,
                                                .n_head = 2,
                                                .n_embd = 8,
                                                .n_positions = 16,
                                                .vocab_size = 300,
                                                .layer_norm_epsilon = 1e-6});
  // The older n_ctx spelling, n_inner, and fields tessera ignores.
  put(out / "seed-hf.json",
      R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 8, "n_ctx": 16,)"
      R"( "n_inner": null, "vocab_size": 300, "resid_pdrop": 0.1, "bos_token_id": 50256})");
}

void tokenizer_seeds(const fs::path& out) {
  fs::create_directories(out);
  const std::string text =
      "the quick brown fox jumps over the lazy dog; don't 42 times!\n  the end\n\xc3\xa9t\xc3\xa9";
  data::BpeTokenizer::train(text, {.vocab_size = 280, .end_of_text = true})
      .save(out / "seed-eot.json");
  data::BpeTokenizer::train(text, {.vocab_size = 270, .end_of_text = false})
      .save(out / "seed-plain.json");
  data::BpeTokenizer().save(out / "seed-bytes.json");
}

void token_file_seeds(const fs::path& out) {
  fs::create_directories(out);
  data::write_token_file(out / "seed-u16.tsrtok", std::vector<uint32_t>{1, 2, 3, 299, 0, 7}, 300);
  data::write_token_file(out / "seed-u32.tsrtok", std::vector<uint32_t>{69999, 65536, 5}, 70000);
  data::write_token_file(out / "seed-one.tsrtok", std::vector<uint32_t>{0}, 1);
}

// Layout of the raw_tokens target: int32 vocabulary size, 1 byte sequence length, uint16 ids.
void raw_tokens_seeds(const fs::path& out) {
  auto seed = [&](const char* name, uint32_t vocab, uint8_t seq, const std::vector<uint16_t>& ids) {
    std::string s;
    for (int i = 0; i < 4; ++i) s += static_cast<char>(vocab >> (8 * i));
    s += static_cast<char>(seq);
    for (uint16_t id : ids) {
      s += static_cast<char>(id & 0xff);
      s += static_cast<char>(id >> 8);
    }
    put(out / name, s);
  };
  std::vector<uint16_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<uint16_t>((i * 7919) % 50257));
  seed("seed-gpt2.bin", 50257, 3, ids);
  seed("seed-small.bin", 10, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2});
}

void checkpoint_seeds(const fs::path& out, const fs::path& scratch) {
  fs::create_directories(out);
  const fs::path step = fuzz::save_fixture_checkpoint(scratch / "checkpoint");
  put(out / "seed-state.json", io::read_file(step / io::kStateFile));
}

void train_config_seeds(const fs::path& out) {
  fs::create_directories(out);
  put(out / "seed-defaults.json", train::to_json(train::TrainConfig{}).dump(2) + "\n");
  put(out / "seed-some.json",
      R"({"data": "train.bin", "vocab": 50257, "layers": 2, "dim": 64, "heads": 4, "seq": 32,)"
      R"( "dp": 2, "zero": 3, "batch": 8, "micro_batch": 2, "lr": 0.001, "optimizer": "sgd",)"
      R"( "seed": 18446744073709551615, "overlap": false, "memory_limit": "2GiB"})");
  put(out / "seed-empty.json", "{}");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  try {
    safetensors_seeds(out / "safetensors");
    hf_config_seeds(out / "hf_config");
    tokenizer_seeds(out / "tokenizer");
    token_file_seeds(out / "token_file");
    raw_tokens_seeds(out / "raw_tokens");
    const fs::path scratch = out / ".scratch";
    checkpoint_seeds(out / "checkpoint", scratch);
    safetensors_index_seeds(out / "safetensors_index", scratch);
    fs::remove_all(scratch);
    train_config_seeds(out / "train_config");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
