// Training checkpoints: a directory of step directories and a `latest` pointer.
//
//   DIR/latest                      "step-00000200\n", replaced atomically
//   DIR/step-00000200/model.safetensors      weights, Hugging Face GPT-2 names
//   DIR/step-00000200/optimizer.safetensors  optimizer state ("exp_avg.<param>", ...)
//   DIR/step-00000200/config.json            Hugging Face GPT-2 config
//   DIR/step-00000200/state.json             step, caller state, version, size + CRC-32 per file
//
// A save writes everything into DIR/step-<N>.tmp/ (state.json last, every file fsync'd), renames
// it to DIR/step-<N>/, then replaces `latest`. A crash at any point leaves the previous
// checkpoint loadable: see docs/FORMATS.md for the argument. Only one process saves into a DIR.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/io/hf_config.h"
#include "tessera/io/safetensors.h"

namespace tessera::io {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kStateFile = "state.json";
inline constexpr const char* kLatestFile = "latest";

// The version string recorded in state.json ("0.1.0").
std::string_view library_version();

// "step-00000100"
std::string step_dir_name(int64_t step);

struct Checkpoint {
  int64_t step = 0;
  HfGptConfig config;
  NamedTensors model;      // global (unsharded) tensors, F32 by convention
  NamedTensors optimizer;  // names chosen by the caller
  // Everything else: RNG seed/state, data sampler position, the training config, ...
  nlohmann::json state = nlohmann::json::object();
};

struct CheckpointOptions {
  int keep_last = 2;  // complete checkpoints kept after a save (>= 1)
  // Called after each file is written into the staging directory (step-<N>.tmp/) with the file's
  // name; what it throws fails the save. For tests of a crash mid-save (a slow write).
  std::function<void(const std::string& file)> after_file;
};

// Saves `ckpt` as DIR/step-<N>/ and points DIR/latest at it; then removes leftovers of crashed
// saves and all but the newest `keep_last` checkpoints. Returns the step directory.
std::filesystem::path save_checkpoint(const std::filesystem::path& dir, const Checkpoint& ckpt,
                                      const CheckpointOptions& options = {});

struct LoadedCheckpoint {
  std::filesystem::path dir;  // the step directory
  int64_t step = 0;
  HfGptConfig config;
  nlohmann::json state;
  std::string tessera_version;
  SafetensorsFile model;  // memory-mapped: read tensors or slices on demand
  SafetensorsFile optimizer;
};

struct CheckpointLoadOptions {
  bool verify_checksums = true;  // sizes are always checked
};

// Complete checkpoints (step directories with a state.json) in DIR, by ascending step.
std::vector<std::pair<int64_t, std::filesystem::path>> list_checkpoints(
    const std::filesystem::path& dir);

// The step directory DIR/latest names if it is complete, else the newest complete one.
std::optional<std::filesystem::path> find_latest_checkpoint(const std::filesystem::path& dir);

// `path` is a checkpoint DIR (its latest checkpoint is loaded) or a step directory. Verifies
// every file's size and checksum; throws IoError naming the corrupt or missing file.
LoadedCheckpoint load_checkpoint(const std::filesystem::path& path,
                                 const CheckpointLoadOptions& options = {});

}  // namespace tessera::io
