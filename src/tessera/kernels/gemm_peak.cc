#include "tessera/kernels/gemm_peak.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "tessera/core/cpu_time.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/gemm.h"

namespace tessera::kernels {
namespace {

// n x n values in [-1, 1): no denormals, no overflow.
std::vector<float> test_matrix(int n, size_t stride) {
  std::vector<float> m(static_cast<size_t>(n) * n);
  for (size_t i = 0; i < m.size(); ++i)
    m[i] = static_cast<float>((i * stride) % 2001) / 1000.0f - 1.0f;
  return m;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// FLOP/s of the best of `reps` n^3 GEMMs after a warm-up (oneDNN creates its primitive), timed
// with `clock`.
double best_gemm_rate(int n, int reps, double (*clock)()) {
  const std::vector<float> a = test_matrix(n, 7919), b = test_matrix(n, 104729);
  std::vector<float> c(a.size());
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = clock();
    gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = clock() - t0;
    if (r > 0 && s > 0) best = std::min(best, s);
  }
  return 2.0 * n * static_cast<double>(n) * n / best;
}

}  // namespace

double measure_gemm_peak(int n, int reps) {
  return best_gemm_rate(n, reps, wall_seconds);
}

double measure_core_gemm_peak(int n, int reps) {
  const int threads = openblas_get_num_threads();
  if (threads != 1) openblas_set_num_threads(1);
  const double rate = best_gemm_rate(n, reps, thread_cpu_seconds);
  if (threads != 1) openblas_set_num_threads(threads);
  return rate;
}

Bf16GemmRates measure_bf16_gemm_rates(int n, int reps) {
  const std::vector<float> af = test_matrix(n, 7919), bf = test_matrix(n, 104729);
  std::vector<uint16_t> a(af.size()), b(bf.size());
  f32_to_bf16(a.data(), af.data(), af.size());
  f32_to_bf16(b.data(), bf.data(), bf.size());
  std::vector<float> c(a.size());
  double best[2] = {1e30, 1e30};
  const Bf16Gemm paths[2] = {Bf16Gemm::OneDnn, Bf16Gemm::Emulated};
  for (int r = 0; r <= reps; ++r)  // r = 0: warm-up (primitive, scratch buffers)
    for (int p = 0; p < 2; ++p) {
      const double t0 = wall_seconds();
      gemm_bf16(paths[p], false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      if (r > 0) best[p] = std::min(best[p], wall_seconds() - t0);
    }
  const double flops = 2.0 * n * static_cast<double>(n) * n;
  return Bf16GemmRates{flops / best[0], flops / best[1], n};
}

}  // namespace tessera::kernels
