#include "tessera/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tessera/kernels/bf16.h"
#include "tessera/kernels/parallel_rows.h"

namespace tessera::optim {

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t,
                  float grad_scale) {
  const float c1 = 1.0f / (1.0f - static_cast<float>(std::pow(beta1, static_cast<double>(t))));
  const float c2 = 1.0f / (1.0f - static_cast<float>(std::pow(beta2, static_cast<double>(t))));
  const float decay = 1.0f - lr * weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - lr * (mi * c1) / (std::sqrt(vi * c2) + eps);
  }
}

AdamW::AdamW(std::vector<Segment> segments, int64_t state_elems, const AdamWConfig& cfg,
             Allocator& alloc)
    : segments_(std::move(segments)), starts_(segments_.size() + 1, 0), cfg_(cfg) {
  for (size_t i = 0; i < segments_.size(); ++i) starts_[i + 1] = starts_[i] + segments_[i].n;
  m_ = Tensor::zeros({state_elems}, DType::F32, MemCategory::OptimizerState, "adamw.exp_avg",
                     &alloc);
  v_ = Tensor::zeros({state_elems}, DType::F32, MemCategory::OptimizerState, "adamw.exp_avg_sq",
                     &alloc);
}

AdamW::AdamW(nn::ParameterSet& params, const AdamWConfig& cfg, Allocator& alloc)
    : AdamW(whole_parameter_segments(params), params.numel(), cfg, alloc) {}

// The update is elementwise, so the segments' elements, taken as one sequence, are split over the
// rank's compute threads (kernels/parallel_rows.h): bitwise what one thread computes. A large model
// takes its optimizer step at memory speed on every core instead of one (GPT-2 124M: 2 GB of state
// read and written per step).
void AdamW::step(float lr) {
  ++t_;
  const float scale = take_grad_scale();
  const bool zero = take_zero_gradients();
  float* m = m_.f32();
  float* v = v_.f32();
  kernels::parallel_rows(starts_.back(), 1, [&](int64_t first, int64_t end) {
    // The last segment that starts at or before `first`, then every one that starts before `end`.
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), first) -
                                   starts_.begin()) -
               1;
    for (; i < segments_.size() && starts_[i] < end; ++i) {
      const Segment& s = segments_[i];
      const int64_t from = std::max(first, starts_[i]) - starts_[i];
      const int64_t to = std::min(end, starts_[i + 1]) - starts_[i];
      const float decay = s.decay ? cfg_.weight_decay : 0.0f;
      const bool copy = s.bf16 != nullptr;
      // Zeroing and copies follow each block while it is in the cache.
      const int64_t block = zero || copy ? kBlock : to - from;
      for (int64_t b = from; b < to; b += block) {
        const int64_t e = std::min(to, b + block);
        adamw_update(s.value + b, m + s.state_offset + b, v + s.state_offset + b, s.grad + b, e - b,
                     lr, cfg_.beta1, cfg_.beta2, cfg_.eps, decay, t_, scale);
        if (zero) std::memset(s.grad + b, 0, sizeof(float) * static_cast<size_t>(e - b));
        if (copy) kernels::f32_to_bf16(s.bf16 + b, s.value + b, e - b);
      }
    }
  });
}

}  // namespace tessera::optim
