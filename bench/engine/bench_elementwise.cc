// The kernels built on the vectorised exp (kernels/vec_math.h) on the shapes of the Llama-style
// benchmark model (C = 768, SwiGLU 2048, V = 16384, B x T = 1024 tokens), one thread, with inputs
// drawn as a training step's are: normal values of about unit scale. Prints billions of elements
// per second (Gelem/s).
// A kernel far slower than its bytes allow points at generated code that takes a slow path, such
// as arithmetic on subnormal numbers (docs/PERFORMANCE.md, "Subnormal constants").
// Usage: bench_elementwise [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tessera/kernels/blas_setup.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/softmax_xent.h"
#include "tessera/kernels/swiglu.h"

namespace {

namespace k = tessera::kernels;
constexpr int64_t kTokens = 1024, kFfn = 2048, kVocab = 16384;

std::vector<float> normal_values(int64_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

void per_element(benchmark::State& state, int64_t elements) {
  state.counters["Gelem/s"] = benchmark::Counter(static_cast<double>(elements) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// gate and up side by side in one [tokens, 2 x ffn] buffer, as the fused gate/up GEMM leaves them.
void SwigluForward(benchmark::State& state) {
  const auto gate_up = normal_values(kTokens * 2 * kFfn, 1.0f, 1);
  std::vector<float> out(static_cast<size_t>(kTokens * kFfn));
  for (auto _ : state) {
    k::swiglu_forward(out.data(), gate_up.data(), gate_up.data() + kFfn, kTokens, kFfn, 2 * kFfn);
    benchmark::DoNotOptimize(out.data());
  }
  per_element(state, kTokens * kFfn);
}

void SwigluBackward(benchmark::State& state) {
  const auto gate_up = normal_values(kTokens * 2 * kFfn, 1.0f, 1);
  const auto dout = normal_values(kTokens * kFfn, 1e-3f, 2);
  std::vector<float> grads(gate_up.size());
  for (auto _ : state) {
    k::swiglu_backward(grads.data(), grads.data() + kFfn, dout.data(), gate_up.data(),
                       gate_up.data() + kFfn, kTokens, kFfn, 2 * kFfn);
    benchmark::DoNotOptimize(grads.data());
  }
  per_element(state, kTokens * kFfn);
}

void GeluForward(benchmark::State& state) {
  const auto in = normal_values(kTokens * kFfn, 1.0f, 3);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    k::gelu_forward(out.data(), in.data(), static_cast<int64_t>(in.size()));
    benchmark::DoNotOptimize(out.data());
  }
  per_element(state, kTokens * kFfn);
}

void GeluBackward(benchmark::State& state) {
  const auto in = normal_values(kTokens * kFfn, 1.0f, 3);
  const auto dout = normal_values(kTokens * kFfn, 1e-3f, 4);
  std::vector<float> din(in.size());
  for (auto _ : state) {
    k::gelu_backward(din.data(), dout.data(), in.data(), static_cast<int64_t>(in.size()));
    benchmark::DoNotOptimize(din.data());
  }
  per_element(state, kTokens * kFfn);
}

std::vector<int32_t> targets() {
  std::vector<int32_t> t(kTokens);
  for (int64_t i = 0; i < kTokens; ++i)
    t[static_cast<size_t>(i)] = static_cast<int32_t>(i * 7 % kVocab);
  return t;
}

void SoftmaxXentForward(benchmark::State& state) {
  const auto logits = normal_values(kTokens * kVocab, 2.0f, 5);
  const auto t = targets();
  std::vector<float> losses(kTokens), lse(kTokens);
  for (auto _ : state) {
    benchmark::DoNotOptimize(k::softmax_xent_forward(losses.data(), lse.data(), logits.data(),
                                                     t.data(), kTokens, kVocab));
  }
  per_element(state, kTokens * kVocab);
}

void SoftmaxXentBackward(benchmark::State& state) {
  const auto logits = normal_values(kTokens * kVocab, 2.0f, 5);
  const auto t = targets();
  std::vector<float> losses(kTokens), lse(kTokens), dlogits(logits.size());
  k::softmax_xent_forward(losses.data(), lse.data(), logits.data(), t.data(), kTokens, kVocab);
  for (auto _ : state) {
    k::softmax_xent_backward(dlogits.data(), logits.data(), lse.data(), t.data(), 1.0f / kTokens,
                             kTokens, kVocab);
    benchmark::DoNotOptimize(dlogits.data());
  }
  per_element(state, kTokens * kVocab);
}

}  // namespace

BENCHMARK(SwigluForward)->Unit(benchmark::kMillisecond);
BENCHMARK(SwigluBackward)->Unit(benchmark::kMillisecond);
BENCHMARK(GeluForward)->Unit(benchmark::kMillisecond);
BENCHMARK(GeluBackward)->Unit(benchmark::kMillisecond);
BENCHMARK(SoftmaxXentForward)->Unit(benchmark::kMillisecond);
BENCHMARK(SoftmaxXentBackward)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  tessera::kernels::use_fast_blas_kernels(argv);
  openblas_set_num_threads(1);  // one thread: parallel_rows then runs inline
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
