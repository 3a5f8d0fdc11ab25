#include "tessera/kernels/softmax_xent.h"

#include <cmath>
#include <cstring>

#include "tessera/kernels/parallel_rows.h"
#include "tessera/kernels/vec_math.h"

namespace tessera::kernels {

// Rows are spread over the rank's compute threads (parallel_rows); the losses are summed after, in
// row order: bitwise one thread's result.
double softmax_xent_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int N, int V) {
  parallel_rows(N, V, [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) {
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
    }
  });
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) total += losses[n];
  return total;
}

void softmax_xent_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, float scale, int N, int V) {
  // The whole vocabulary is the slice that starts at 0.
  softmax_xent_backward_slice(dlogits, logits, lse, targets, 0, scale, N, V);
}

}  // namespace tessera::kernels

namespace tessera::kernels {

void vocab_slice_max(float* row_max, const float* logits, int N, int V) {
  parallel_rows(N, V, [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) {
      const float* x = logits + n * V;
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int v = 0; v < V; ++v) mx = std::max(mx, x[v]);
      row_max[n] = mx;
    }
  });
}

void vocab_slice_sum_exp(float* sum_exp, float* target_logit, const float* logits,
                         const float* row_max, const int32_t* targets, int64_t vocab_begin, int N,
                         int V) {
  parallel_rows(N, V, [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) {
      const float* x = logits + n * V;
      const float mx = row_max[n];
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int v = 0; v < V; ++v) sum += detail::exp_f(x[v] - mx);
      sum_exp[n] = sum;
      const int64_t local = static_cast<int64_t>(targets[n]) - vocab_begin;
      target_logit[n] = targets[n] >= 0 && local >= 0 && local < V ? x[local] : 0.0f;
    }
  });
}

void softmax_xent_backward_slice(float* dlogits, const float* logits, const float* lse,
                                 const int32_t* targets, int64_t vocab_begin, float scale, int N,
                                 int V) {
  if (V == 0) return;  // an empty vocabulary shard has no logits (and null buffers)
  parallel_rows(N, V, [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) {
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
      const int64_t local = static_cast<int64_t>(tgt) - vocab_begin;
      if (local >= 0 && local < V) d[local] -= scale;
    }
  });
}

}  // namespace tessera::kernels
