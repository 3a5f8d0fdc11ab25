#include "tessera/optim/sgd.h"

namespace tessera::optim {

SGD::SGD(nn::ParameterSet& params, const SGDConfig& cfg, Allocator& alloc)
    : params_(params), cfg_(cfg) {
  if (cfg_.momentum > 0.0f)
    momentum_ = Tensor::zeros({params_.numel()}, DType::F32, MemCategory::OptimizerState,
                              "sgd.momentum", &alloc);
}

void SGD::step(float lr) {
  ++t_;
  float* p = params_.flat_params().f32();
  const float* g = params_.flat_grads().f32();
  float* buf = momentum_.defined() ? momentum_.f32() : nullptr;
  for (const nn::ParamInfo& info : params_.infos()) {
    const float decay = 1.0f - lr * (info.weight_decay ? cfg_.weight_decay : 0.0f);
    for (int64_t i = info.offset, e = info.offset + info.local_numel(); i < e; ++i) {
      float d = g[i];
      if (buf) d = buf[i] = cfg_.momentum * buf[i] + g[i];
      p[i] = p[i] * decay - lr * d;
    }
  }
}

std::vector<NamedTensor> SGD::state() {
  std::vector<NamedTensor> out;
  if (!momentum_.defined()) return out;
  for (const nn::ParamInfo& info : params_.infos())
    out.emplace_back("momentum." + info.name, momentum_.view(info.offset, info.local_shape));
  return out;
}

}  // namespace tessera::optim
