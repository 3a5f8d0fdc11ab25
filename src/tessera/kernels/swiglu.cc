#include "tessera/kernels/swiglu.h"

#include "tessera/kernels/parallel_rows.h"
#include "tessera/kernels/vec_math.h"

namespace tessera::kernels {

namespace {
inline float sigmoid_f(float g) {
  return 1.0f / (1.0f + detail::exp_f(-g));
}
}  // namespace

// Rows are spread over the rank's compute threads (parallel_rows: elementwise, so bitwise one
// thread's result), which otherwise wait in the BLAS's spin loop beside this work.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t rows, int64_t cols,
                    int64_t ld) {
  parallel_rows(rows, cols, [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) {
      const float* g = gate + r * ld;
      const float* u = up + r * ld;
      float* y = out + r * cols;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) y[c] = g[c] * sigmoid_f(g[c]) * u[c];
    }
  });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t rows, int64_t cols, int64_t ld) {
  parallel_rows(rows, cols, [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) {
      const float* g = gate + r * ld;
      const float* u = up + r * ld;
      const float* dy = dout + r * cols;
      float* dg = dgate + r * ld;
      float* du = dup + r * ld;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) {
        const float gc = g[c], uc = u[c], dyc = dy[c];  // read before dg, du overwrite them
        const float s = sigmoid_f(gc);
        dg[c] = dyc * uc * s * (1.0f + gc * (1.0f - s));
        du[c] = dyc * (gc * s);
      }
    }
  });
}

}  // namespace tessera::kernels
