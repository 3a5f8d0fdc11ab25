#include "tessera/kernels/softmax_xent.h"

#include <cmath>
#include <cstring>

#include "tessera/kernels/vec_math.h"

namespace tessera::kernels {

double softmax_xent_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int N, int V) {
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; ++v) mx = std::max(mx, x[v]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) sum += detail::exp_f(x[v] - mx);
    const float l = mx + std::log(sum);
    lse[n] = l;
    const int32_t tgt = targets[n];
    losses[n] = tgt < 0 ? 0.0f : l - x[tgt];
    total += losses[n];
  }
  return total;
}

void softmax_xent_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, float scale, int N, int V) {
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    float* d = dlogits + n * V;
    const int32_t tgt = targets[n];
    if (tgt < 0) {
      std::memset(d, 0, sizeof(float) * V);
      continue;
    }
    const float l = lse[n];
#pragma omp simd
    for (int v = 0; v < V; ++v) d[v] = detail::exp_f(x[v] - l) * scale;
    d[tgt] -= scale;
  }
}

}  // namespace tessera::kernels
