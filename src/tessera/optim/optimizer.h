// Optimizers update a ParameterSet in place from its gradients. State lives in flat buffers
// aligned with the parameter buffer, so a ZeRO shard of the state is an offset range.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/nn/parameters.h"

namespace tessera::optim {

// A named piece of optimizer state: "exp_avg.h.0.attn.c_attn.weight" -> view of the state buffer.
using NamedTensor = std::pair<std::string, Tensor>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate `lr` over every parameter.
  virtual void step(float lr) = 0;
  // Number of updates taken (AdamW's bias correction uses it).
  virtual int64_t steps() const = 0;
  virtual void set_steps(int64_t t) = 0;
  // Per-parameter state views, for checkpoints (write into them to restore).
  virtual std::vector<NamedTensor> state() = 0;
  virtual std::string name() const = 0;
};

}  // namespace tessera::optim
