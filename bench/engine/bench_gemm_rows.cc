// GEMM throughput against the number of rows M, on the shapes of one GPT-2 MLP (an MoE expert's
// block of rows): fc [M, C] x [C, 4C], proj [M, 4C] x [4C, C] and the weight gradient
// [C, 4C] += [M, C]^T [M, 4C], one BLAS thread. The MoE layer cuts its local work into pieces of
// at least 256 rows (nn/moe.cc); this measures what smaller pieces would cost.
// Usage: bench_gemm_rows [--benchmark_filter=...]   (C = 256 and 512)
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "tessera/kernels/blas_setup.h"
#include "tessera/kernels/gemm.h"

namespace {

enum Shape { Fc, Proj, FcWeightGrad };

void gemm_rows(benchmark::State& state, Shape shape) {
  const int M = static_cast<int>(state.range(0)), C = static_cast<int>(state.range(1)), F = 4 * C;
  std::vector<float> a(static_cast<size_t>(M) * F, 0.5f), b(static_cast<size_t>(F) * C, 0.25f),
      c(static_cast<size_t>(F) * std::max(M, C), 0.0f);
  namespace k = tessera::kernels;
  for (auto _ : state) {
    switch (shape) {
      case Fc:  // [M, C] x [C, F]
        k::sgemm(false, false, M, F, C, 1.0f, a.data(), C, b.data(), F, 0.0f, c.data(), F);
        break;
      case Proj:  // [M, F] x [F, C]
        k::sgemm(false, false, M, C, F, 1.0f, a.data(), F, b.data(), C, 0.0f, c.data(), C);
        break;
      case FcWeightGrad:  // [C, F] += [M, C]^T [M, F]
        k::sgemm(true, false, C, F, M, 1.0f, a.data(), C, b.data(), F, 1.0f, c.data(), F);
        break;
    }
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * C * F, benchmark::Counter::kIsIterationInvariantRate);
}

void rows(benchmark::internal::Benchmark* b) {
  for (int C : {256, 512})
    for (int M : {64, 128, 256, 512, 1024}) b->Args({M, C});
}

BENCHMARK_CAPTURE(gemm_rows, fc, Fc)->Apply(rows);
BENCHMARK_CAPTURE(gemm_rows, proj, Proj)->Apply(rows);
BENCHMARK_CAPTURE(gemm_rows, fc_weight_grad, FcWeightGrad)->Apply(rows);

}  // namespace

int main(int argc, char** argv) {
  tessera::kernels::use_fast_blas_kernels(argv);
  openblas_set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
