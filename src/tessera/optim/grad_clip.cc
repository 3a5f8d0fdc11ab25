#include "tessera/optim/grad_clip.h"

#include <cmath>

namespace tessera::optim {

namespace {
// Sum of squares of g[0, n): float partial sums over blocks (vectorisable), blocks in double.
double sum_of_squares(const float* g, int64_t n) {
  double total = 0;
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    float s = 0;
    for (int64_t i = b, e = std::min(n, b + kBlock); i < e; ++i) s += g[i] * g[i];
    total += s;
  }
  return total;
}
}  // namespace

double grad_sum_of_squares(const std::vector<Segment>& segments, const nn::ParameterSet& params) {
  double total = 0;
  for (const Segment& s : segments)
    if (params.infos()[s.param].reduction.counts_in_norm) total += sum_of_squares(s.grad, s.n);
  return total;
}

float clip_to_norm(const std::vector<Segment>& segments, double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  const float scale = static_cast<float>(max_norm / (norm + 1e-6));
  for (const Segment& s : segments) {
    for (int64_t i = 0; i < s.n; ++i) s.grad[i] *= scale;
  }
  return scale;
}

double grad_sum_of_squares(const nn::ParameterSet& params) {
  // Padding between parameters is always zero, so the flat buffer can be summed whole. Partial
  // sums in float over blocks keep the loop vectorisable; blocks are accumulated in double.
  return sum_of_squares(params.flat_grads().f32(), params.numel());
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
