#include "tessera/kernels/layernorm.h"

#include <cmath>
#include <cstdint>

#include "tessera/kernels/parallel_rows.h"

namespace tessera::kernels {

// Rows are spread over the rank's compute threads (parallel_rows): bitwise one thread's result.
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int N, int C, float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
  parallel_rows(N, C, [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) {
      const float* x = in + n * C;
      float* o = out + n * C;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int c = 0; c < C; ++c) sum += x[c];
      const float m = sum * inv_c;
      float var = 0.0f;  // two passes: no cancellation when |mean| >> std
#pragma omp simd reduction(+ : var)
      for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
      const float s = 1.0f / std::sqrt(var * inv_c + eps);
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

// Two passes so that both spread over the threads and stay bitwise one thread's result: din by
// rows, then dweight and dbias by columns, each column summed over the rows in row order.
void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                        const float* in, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  const float inv_c = 1.0f / static_cast<float>(C);
  parallel_rows(N, C, [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) {
      const float* x = in + n * C;
      const float* dy = dout + n * C;
      float* dx = din + n * C;
      const float m = mean[n], s = rstd[n];
      // With xhat = (x - m) s and g = dy * weight: dx = s (g - mean(g) - xhat mean(g xhat)).
      float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int c = 0; c < C; ++c) {
        const float xhat = (x[c] - m) * s;
        const float g = dy[c] * weight[c];
        sum_g += g;
        sum_gx += g * xhat;
      }
      const float mg = sum_g * inv_c, mgx = sum_gx * inv_c;
      for (int c = 0; c < C; ++c) {
        const float xhat = (x[c] - m) * s;
        dx[c] += s * (dy[c] * weight[c] - mg - xhat * mgx);
      }
    }
  });
  parallel_rows(C, N, [&](int64_t first, int64_t end) {  // "rows" here: columns of dweight
    for (int64_t n = 0; n < N; ++n) {
      const float* x = in + n * C;
      const float* dy = dout + n * C;
      const float m = mean[n], s = rstd[n];
#pragma omp simd
      for (int64_t c = first; c < end; ++c) {
        const float xhat = (x[c] - m) * s;
        dweight[c] += dy[c] * xhat;
        dbias[c] += dy[c];
      }
    }
  });
}

}  // namespace tessera::kernels
