#include "tessera/optim/grad_clip.h"

#include <cmath>

namespace tessera::optim {

double grad_sum_of_squares(const nn::ParameterSet& params) {
  // Padding between parameters is always zero, so the flat buffer can be summed whole. Partial
  // sums in float over blocks keep the loop vectorisable; blocks are accumulated in double.
  const float* g = params.flat_grads().f32();
  const int64_t n = params.numel();
  double total = 0;
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    float s = 0;
    for (int64_t i = b, e = std::min(n, b + kBlock); i < e; ++i) s += g[i] * g[i];
    total += s;
  }
  return total;
}

float clip_to_norm(nn::ParameterSet& params, double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  const float scale = static_cast<float>(max_norm / (norm + 1e-6));
  float* g = params.flat_grads().f32();
  for (int64_t i = 0, n = params.numel(); i < n; ++i) g[i] *= scale;
  return scale;
}

double clip_grad_norm(nn::ParameterSet& params, double max_norm) {
  double norm = std::sqrt(grad_sum_of_squares(params));
  clip_to_norm(params, norm, max_norm);
  return norm;
}

}  // namespace tessera::optim
