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

// The update of one contiguous range of a parameter (raw kernel; `t` is the 1-based step), from
// the gradient times grad_scale.
void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t,
                  float grad_scale = 1.0f);

class AdamW final : public Optimizer {
 public:
  // Updates `segments`; the state buffers hold state_elems elements (>= every segment's end).
  AdamW(std::vector<Segment> segments, int64_t state_elems, const AdamWConfig& cfg,
        Allocator& alloc);
  // Every parameter of `params`, state laid out like the flat buffer.
  AdamW(nn::ParameterSet& params, const AdamWConfig& cfg, Allocator& alloc);
  void step(float lr) override;
  int64_t steps() const override { return t_; }
  void set_steps(int64_t t) override { t_ = t; }
  std::vector<NamedTensor> state_buffers() override {
    return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
  }
  const std::vector<Segment>& segments() const override { return segments_; }
  std::string name() const override { return "adamw"; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  std::vector<Segment> segments_;
  std::vector<int64_t> starts_;  // segment i is elements [starts_[i], starts_[i + 1]) of the step
  AdamWConfig cfg_;
  Tensor m_, v_;
  int64_t t_ = 0;
};

}  // namespace tessera::optim
