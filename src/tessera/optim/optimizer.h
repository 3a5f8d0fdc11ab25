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

// A contiguous run of one parameter's elements that this optimizer updates. Single-rank training
// has one segment per parameter; a ZeRO rank has segments for the parts of its shard.
struct Segment {
  int param = 0;             // index in the ParameterSet
  int64_t param_offset = 0;  // first element within the parameter (row-major, local shape)
  int64_t n = 0;
  float* value = nullptr;    // the n parameter values, updated in place
  float* grad = nullptr;     // read by the update (times the step's gradient scale)
  int64_t state_offset = 0;  // where the n elements live in the optimizer's state buffers
  bool decay = true;         // weight decay applies
  // The values' bf16 copy (nn::ParameterSet::bf16_copy), if any: every step writes it from the
  // values it has just updated, block by block while they are in the cache (the conversion the
  // next forward would make, without a pass of its own over the weights: nn/parameters.h).
  uint16_t* bf16 = nullptr;
};

// One segment per parameter, state laid out like the flat parameter buffer.
std::vector<Segment> whole_parameter_segments(const nn::ParameterSet& params);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate `lr` over every parameter.
  virtual void step(float lr) = 0;
  // Number of updates taken (AdamW's bias correction uses it).
  virtual int64_t steps() const = 0;
  virtual void set_steps(int64_t t) = 0;
  // The state buffers by kind ("exp_avg", "exp_avg_sq", "momentum"), indexed by state_offset.
  virtual std::vector<NamedTensor> state_buffers() = 0;
  virtual const std::vector<Segment>& segments() const = 0;
  // Per-parameter state views ("exp_avg.<param name>"), for checkpoints (write into them to
  // restore). Only for whole-parameter segments (single rank, plain data parallelism).
  std::vector<NamedTensor> state(const nn::ParameterSet& params);
  virtual std::string name() const = 0;
  // The next step() reads every gradient multiplied by `s` (global-norm clipping's factor), then
  // the scale is 1 again. The gradients are not changed: against scaling them in place first, the
  // update is bitwise the same and one pass over them (read and write) is saved.
  void scale_gradients_in_next_step(float s) { grad_scale_ = s; }
  // The next step() also leaves every gradient it reads at zero: each block of a segment's
  // gradient is zeroed right after the update has read it, while it is still in the cache. That
  // is the zeroing the following step needs, without a pass of its own over memory (400 MB for a
  // 100M-parameter model). The update is bitwise the same.
  void zero_gradients_in_next_step() { zero_gradients_ = true; }

 protected:
  // The scale for this step; resets it to 1.
  float take_grad_scale() { return std::exchange(grad_scale_, 1.0f); }
  // Whether this step zeroes the gradients it reads; resets the request.
  bool take_zero_gradients() { return std::exchange(zero_gradients_, false); }
  // Elements updated before their gradients are zeroed and their bf16 copies written (16 KB of
  // each: in the L1 cache still).
  static constexpr int64_t kBlock = 4096;

 private:
  float grad_scale_ = 1.0f;
  bool zero_gradients_ = false;
};

}  // namespace tessera::optim
