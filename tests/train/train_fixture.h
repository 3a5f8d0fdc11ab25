// A tiny corpus and model so end-to-end training tests take a fraction of a second per step.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/core/error.h"
#include "tessera/train/train_config.h"
#include "tessera/train/trainer.h"

namespace tessera::train::testing {

inline std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("tessera_train_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline std::filesystem::path write_corpus(const std::filesystem::path& dir) {
  auto p = dir / "corpus.txt";
  std::ofstream out(p);
  const char* lines[] = {"The quick brown fox jumps over the lazy dog.\n",
                         "A journey of a thousand miles begins with a single step.\n",
                         "To be or not to be, that is the question.\n",
                         "All that glitters is not gold.\n"};
  for (int i = 0; i < 300; ++i) out << lines[(i * 7) % 4] << "%\n";
  return p;
}

inline TrainConfig tiny_config(const std::filesystem::path& dir) {
  TrainConfig c;
  c.data = write_corpus(dir).string();
  c.cache_dir = (dir / "cache").string();
  c.vocab = 300;
  c.layers = 2;
  c.dim = 32;
  c.heads = 2;
  c.seq = 16;
  c.batch = 4;
  c.steps = 6;
  c.warmup = 2;
  c.lr = 3e-3f;
  c.eval_every = 0;
  c.eval_batches = 2;
  c.sample_tokens = 0;
  c.threads = 1;
  c.dropout = 0.1f;
  return c;
}

// The message of the ConfigError that running `c` throws, or "no error".
// The ConfigError a run of `c` stops with, as the command line shows it (keys as flags).
inline std::string config_error_of(const TrainConfig& c) {
  try {
    run_training(c, nullptr);
  } catch (const ConfigError& e) {
    return e.render(flag_of);
  }
  return "no error";
}

}  // namespace tessera::train::testing
