#include "tessera/optim/adamw.h"

#include <cmath>

namespace tessera::optim {

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  const float c1 = 1.0f / (1.0f - static_cast<float>(std::pow(beta1, static_cast<double>(t))));
  const float c2 = 1.0f / (1.0f - static_cast<float>(std::pow(beta2, static_cast<double>(t))));
  const float decay = 1.0f - lr * weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - lr * (mi * c1) / (std::sqrt(vi * c2) + eps);
  }
}

AdamW::AdamW(nn::ParameterSet& params, const AdamWConfig& cfg, Allocator& alloc)
    : params_(params), cfg_(cfg) {
  int64_t n = params_.numel();
  m_ = Tensor::zeros({n}, DType::F32, MemCategory::OptimizerState, "adamw.exp_avg", &alloc);
  v_ = Tensor::zeros({n}, DType::F32, MemCategory::OptimizerState, "adamw.exp_avg_sq", &alloc);
}

void AdamW::step(float lr) {
  ++t_;
  float* p = params_.flat_params().f32();
  const float* g = params_.flat_grads().f32();
  float* m = m_.f32();
  float* v = v_.f32();
  for (const nn::ParamInfo& info : params_.infos()) {
    int64_t o = info.offset;
    adamw_update(p + o, m + o, v + o, g + o, info.local_numel(), lr, cfg_.beta1, cfg_.beta2,
                 cfg_.eps, info.weight_decay ? cfg_.weight_decay : 0.0f, t_);
  }
}

std::vector<NamedTensor> AdamW::state() {
  std::vector<NamedTensor> out;
  for (const nn::ParamInfo& info : params_.infos()) {
    out.emplace_back("exp_avg." + info.name, m_.view(info.offset, info.local_shape));
    out.emplace_back("exp_avg_sq." + info.name, v_.view(info.offset, info.local_shape));
  }
  return out;
}

}  // namespace tessera::optim
