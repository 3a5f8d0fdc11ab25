#include "tessera/kernels/rmsnorm.h"

#include <cmath>

#include "tessera/kernels/parallel_rows.h"

namespace tessera::kernels {

// Rows are spread over the rank's compute threads (parallel_rows): bitwise one thread's result.
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t N,
                     int64_t C, float eps) {
  parallel_rows(N, C, [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) {
      const float* x = in + n * C;
      float* y = out + n * C;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
      rstd[n] = r;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
    }
  });
}

// Two passes so that both spread over the threads and stay bitwise one thread's result: din by
// rows, then dweight by columns, each column summed over the rows in row order.
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t N, int64_t C) {
  parallel_rows(N, C, [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) {
      const float* x = in + n * C;
      const float* dy = dout + n * C;
      float* dx = din + n * C;
      const float r = rstd[n];
      float dot = 0.0f;  // sum over c of dout * w * x
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += dy[c] * weight[c] * x[c];
      const float k = r * r * dot / static_cast<float>(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] += r * (dy[c] * weight[c] - x[c] * k);
    }
  });
  parallel_rows(C, N, [&](int64_t first, int64_t end) {  // "rows" here: columns of dweight
    for (int64_t n = 0; n < N; ++n) {
      const float* x = in + n * C;
      const float* dy = dout + n * C;
      const float r = rstd[n];
#pragma omp simd
      for (int64_t c = first; c < end; ++c) dweight[c] += dy[c] * x[c] * r;
    }
  });
}

}  // namespace tessera::kernels
