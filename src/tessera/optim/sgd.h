// SGD with optional momentum (PyTorch convention: buf = mu buf + g; p -= lr * buf) and decoupled
// weight decay (p -= lr * wd * p where enabled).
#pragma once

#include "tessera/optim/optimizer.h"

namespace tessera::optim {

struct SGDConfig {
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

class SGD final : public Optimizer {
 public:
  SGD(std::vector<Segment> segments, int64_t state_elems, const SGDConfig& cfg, Allocator& alloc);
  SGD(nn::ParameterSet& params, const SGDConfig& cfg, Allocator& alloc);
  void step(float lr) override;
  int64_t steps() const override { return t_; }
  void set_steps(int64_t t) override { t_ = t; }
  std::vector<NamedTensor> state_buffers() override;
  const std::vector<Segment>& segments() const override { return segments_; }
  std::string name() const override { return "sgd"; }

 private:
  std::vector<Segment> segments_;
  SGDConfig cfg_;
  Tensor momentum_;  // allocated only when momentum > 0
  int64_t t_ = 0;
};

}  // namespace tessera::optim
