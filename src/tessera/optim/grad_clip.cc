#include "tessera/optim/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessera/kernels/parallel_rows.h"

namespace tessera::optim {

namespace {
constexpr int64_t kBlock = 4096;
constexpr int kLanes = 16;

// Sum of squares of one block of at most kBlock elements: 16 float lanes (element i in lane i %
// 16, a loop the compiler vectorises without reassociating anything), the lanes added in double.
double block_sum_of_squares(const float* g, int64_t n) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += g[i + j] * g[i + j];
  for (; i < n; ++i) lane[i % kLanes] += g[i] * g[i];
  double s = 0;
  for (float v : lane) s += v;
  return s;
}

// Sum of squares of g[0, n): per block of kBlock elements as above, the blocks' sums added in
// double in block order. Blocks are spread over the rank's compute threads; the result does not
// depend on how many there are.
double sum_of_squares(const float* g, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> sums(static_cast<size_t>(blocks));
  kernels::parallel_rows(blocks, kBlock, [&](int64_t first, int64_t end) {
    for (int64_t b = first; b < end; ++b)
      sums[static_cast<size_t>(b)] =
          block_sum_of_squares(g + b * kBlock, std::min(kBlock, n - b * kBlock));
  });
  double total = 0;
  for (double s : sums) total += s;
  return total;
}

// g[0, n) *= scale, over the rank's compute threads (elementwise: bitwise one thread's).
void scale_gradients(float* g, int64_t n, float s) {
  kernels::parallel_rows((n + kBlock - 1) / kBlock, kBlock, [&](int64_t first, int64_t end) {
    for (int64_t i = first * kBlock, e = std::min(n, end * kBlock); i < e; ++i) g[i] *= s;
  });
}
}  // namespace

double grad_sum_of_squares(const std::vector<Segment>& segments, const nn::ParameterSet& params) {
  double total = 0;
  for (const Segment& s : segments)
    if (params.infos()[s.param].reduction.counts_in_norm) total += sum_of_squares(s.grad, s.n);
  return total;
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

float clip_to_norm(const std::vector<Segment>& segments, double norm, double max_norm) {
  const float scale = clip_scale(norm, max_norm);
  if (scale == 1.0f) return 1.0f;
  for (const Segment& s : segments) scale_gradients(s.grad, s.n, scale);
  return scale;
}

double grad_sum_of_squares(const nn::ParameterSet& params) {
  // Padding between parameters is always zero, so the flat buffer can be summed whole. Partial
  // sums in float over blocks keep the loop vectorisable; blocks are accumulated in double.
  return sum_of_squares(params.flat_grads().f32(), params.numel());
}

float clip_to_norm(nn::ParameterSet& params, double norm, double max_norm) {
  const float scale = clip_scale(norm, max_norm);
  if (scale == 1.0f) return 1.0f;
  scale_gradients(params.flat_grads().f32(), params.numel(), scale);
  return scale;
}

double clip_grad_norm(nn::ParameterSet& params, double max_norm) {
  double norm = std::sqrt(grad_sum_of_squares(params));
  clip_to_norm(params, norm, max_norm);
  return norm;
}

}  // namespace tessera::optim
