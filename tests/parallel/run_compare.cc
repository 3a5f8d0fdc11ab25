#include "run_compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tessera::train::testing {

Reference run_reference(const std::string& name, TrainConfig c, const std::filesystem::path& dir) {
  c.save = (dir / name).string();
  c.metrics = (dir / (name + ".jsonl")).string();
  Reference r;
  r.losses = run_training(c, nullptr).losses;
  r.weights = read_weights(dir / name / "model.safetensors");
  std::ifstream in(c.metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("grad_norm")) r.grad_norms.push_back(j["grad_norm"].get<double>());
  }
  return r;
}

void expect_same_run(const Reference& ref, const Reference& got, double weight_rel,
                     double expert_weight_rel) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i + 1;
  // AdamW is nearly invariant to a constant gradient scale, so a miscounted norm would hide in the
  // losses: compare the norms themselves.
  ASSERT_EQ(got.grad_norms.size(), ref.losses.size());
  ASSERT_EQ(ref.grad_norms.size(), ref.losses.size());
  for (size_t i = 0; i < got.grad_norms.size(); ++i)
    EXPECT_NEAR(got.grad_norms[i], ref.grad_norms[i], 1e-5 * ref.grad_norms[i])
        << "gradient norm, step " << i + 1;
  expect_same_weights(ref.weights, got.weights, weight_rel, expert_weight_rel);
}

void expect_resumed(const TrainResult& whole, const TrainResult& rest, int64_t at) {
  EXPECT_EQ(rest.first_step, at);
  ASSERT_EQ(rest.losses.size(), whole.losses.size() - static_cast<size_t>(at));
  for (size_t i = 0; i < rest.losses.size(); ++i)
    EXPECT_NEAR(rest.losses[i], whole.losses[at + i], 1e-5 * std::abs(whole.losses[at + i]))
        << "step " << at + i + 1;
}

}  // namespace tessera::train::testing
