// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr * wd * p   (wd only where enabled)
#pragma once

#include "tessera/optim/optimizer.h"

namespace tessera::optim {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// The update of one contiguous range of a parameter (raw kernel; `t` is the 1-based step).
void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t);

class AdamW final : public Optimizer {
 public:
  AdamW(nn::ParameterSet& params, const AdamWConfig& cfg, Allocator& alloc);
  void step(float lr) override;
  int64_t steps() const override { return t_; }
  void set_steps(int64_t t) override { t_ = t; }
  std::vector<NamedTensor> state() override;
  std::string name() const override { return "adamw"; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  nn::ParameterSet& params_;
  AdamWConfig cfg_;
  Tensor m_, v_;  // same layout as the flat parameter buffer
  int64_t t_ = 0;
};

}  // namespace tessera::optim
