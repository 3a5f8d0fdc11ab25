// The bf16 training set-up the mixed-precision tests share: a tiny model with dropout and clipping
// on, one sequence per micro-batch in every layout, and the one-rank bf16 run they compare with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::train::testing {

inline TrainConfig bf16_config(const std::filesystem::path& dir, bool moe = false) {
  TrainConfig c = tiny_config(dir);
  c.heads = 4;
  c.batch = 4;
  c.micro_batch = 1;  // one sequence per micro-batch in every layout
  c.steps = 5;
  c.lr = 5e-3f;
  c.dropout = 0.1f;
  c.grad_clip = 0.5f;
  c.bucket_mb = 0.01;
  c.val_fraction = 0;
  c.precision = kernels::Precision::BF16;
  if (moe) {
    c.moe_experts = 4;
    c.moe_capacity_factor = 0.75f;
    c.moe_aux_loss = 0.05f;
    c.moe_z_loss = 0.01f;
  }
  return c;
}

// Largest |got - ref| / |ref| over the steps.
inline double max_rel_loss_diff(const std::vector<double>& ref, const std::vector<double>& got) {
  EXPECT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i)
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / std::fabs(ref[i]));
  return worst;
}

inline const std::vector<double>& one_bf16_rank(bool moe) {
  static std::map<bool, std::vector<double>> refs;
  auto it = refs.find(moe);
  if (it == refs.end()) {
    auto dir = temp_dir(moe ? "bf16_reference_moe" : "bf16_reference");
    it = refs.emplace(moe, run_training(bf16_config(dir, moe), nullptr).losses).first;
  }
  return it->second;
}

}  // namespace tessera::train::testing
