// The training run the tensor- and sequence-parallel equivalence tests compare against: a tiny
// GPT with 4 heads (divisible by tp in {1, 2, 4}), dropout and gradient clipping on, several
// gradient buckets, trained on one rank once per test binary.
#pragma once

#include <filesystem>

#include "run_compare.h"
#include "train_fixture.h"

namespace tessera::train::testing {

inline TrainConfig tp_config(const std::filesystem::path& dir) {
  TrainConfig c = testing::tiny_config(dir);
  c.heads = 4;  // divisible by tp in {1, 2, 4}
  c.batch = 12;
  c.steps = 12;
  c.warmup = 3;
  c.lr = 5e-3f;
  c.dropout = 0.1f;
  c.grad_clip = 0.5f;  // exercised: the norm is well above 0.5 early on
  c.bucket_mb = 0.01;  // several buckets
  c.val_fraction = 0;
  return c;
}

inline const Reference& tp_one_rank() {
  static Reference ref = [] {
    auto dir = temp_dir("tp_reference");
    return run_reference("run", tp_config(dir), dir);
  }();
  return ref;
}

}  // namespace tessera::train::testing
