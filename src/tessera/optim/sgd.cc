#include "tessera/optim/sgd.h"

#include "tessera/kernels/bf16.h"

namespace tessera::optim {

SGD::SGD(std::vector<Segment> segments, int64_t state_elems, const SGDConfig& cfg, Allocator& alloc)
    : segments_(std::move(segments)), cfg_(cfg) {
  if (cfg_.momentum > 0.0f)
    momentum_ = Tensor::zeros({state_elems}, DType::F32, MemCategory::OptimizerState,
                              "sgd.momentum", &alloc);
}

SGD::SGD(nn::ParameterSet& params, const SGDConfig& cfg, Allocator& alloc)
    : SGD(whole_parameter_segments(params), params.numel(), cfg, alloc) {}

void SGD::step(float lr) {
  ++t_;
  const float scale = take_grad_scale();
  const bool zero = take_zero_gradients();
  float* buf = momentum_.defined() ? momentum_.f32() : nullptr;
  for (const Segment& s : segments_) {
    const float decay = 1.0f - lr * (s.decay ? cfg_.weight_decay : 0.0f);
    float* b = buf ? buf + s.state_offset : nullptr;
    for (int64_t i = 0; i < s.n; ++i) {
      float d = s.grad[i] * scale;
      if (b) d = b[i] = cfg_.momentum * b[i] + d;
      s.value[i] = s.value[i] * decay - lr * d;
      if (zero) s.grad[i] = 0.0f;
    }
    if (s.bf16 != nullptr) kernels::f32_to_bf16(s.bf16, s.value, s.n);
  }
}

std::vector<NamedTensor> SGD::state_buffers() {
  if (!momentum_.defined()) return {};
  return {{"momentum", momentum_}};
}

}  // namespace tessera::optim
