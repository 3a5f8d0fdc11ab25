// The checkpoint that the checkpoint fuzz target loads with each input as its state.json, and
// that make_seeds writes the seed state.json from. Its files are the same bytes every time, so
// the sizes and CRC-32s recorded in a saved state.json stay valid.
#pragma once

#include <filesystem>

#include "tessera/io/checkpoint.h"

namespace tessera::fuzz {

inline constexpr int64_t kFixtureStep = 7;

// Saves a tiny GPT-2 checkpoint (step kFixtureStep) into `dir`; returns its step directory.
inline std::filesystem::path save_fixture_checkpoint(const std::filesystem::path& dir) {
  io::Checkpoint c;
  c.step = kFixtureStep;
  c.config = {.n_layer = 1, .n_head = 1, .n_embd = 2, .n_positions = 2, .vocab_size = 3};
  float v = 0.0f;
  for (const io::ExpectedTensor& e : io::gpt2_expected_tensors(c.config)) {
    Tensor t = Tensor::empty(e.shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = (v += 0.25f);
    c.optimizer.emplace_back("exp_avg." + e.name, Tensor::zeros(e.shape));
    c.model.emplace_back(e.name, std::move(t));
  }
  c.state = {{"seed", 1337},
             {"optimizer", "adamw"},
             {"optimizer_steps", kFixtureStep},
             {"sampler", {{"epoch", 0}, {"index", 56}}}};
  return io::save_checkpoint(dir, c);
}

}  // namespace tessera::fuzz
