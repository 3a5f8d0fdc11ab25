// The GEMMs of one training step and nothing else: what a step could take if every other kernel
// were free. Runs the model's own dense-layer kernels (kernels/gemm.h: matmul_forward and
// matmul_backward, matmul_nt_* for a tied head; fp32, OpenBLAS) on the shapes of a
// Llama-style or GPT-2 decoder, and prints the median over rounds of their summed time and the
// tokens/s that time allows. The attention core (query-key and probability-value products) is
// left out: it runs in the fused attention kernel, a small share at T = 256.
// A framework whose step is dominated by the same GEMMs cannot be more than
// (its step time) / (this time) times faster than another: bench/llama/vs_pytorch.sh prints that
// ceiling beside its ratios.
//
// With --precision bf16 the GEMMs run as `tessera train --precision bf16` runs them: bf16 inputs,
// fp32 accumulation, through the path --bf16-gemm auto picks (oneDNN where the CPU has bf16
// units), the weights read from bf16 copies (made once per step in training, outside this time),
// the activations and output gradients rounded at each GEMM as in training.
//
// Usage: bench_step_gemms [--family llama|gpt2] [--layers L] [--dim C] [--heads H]
//                         [--kv-heads KV] [--ffn F] [--vocab V] [--tokens N] [--threads T]
//                         [--rounds R] [--precision fp32|bf16]
// Defaults: the Llama-style benchmark model of bench/llama/vs_pytorch.sh (L=12, C=768, 12 query
// over 4 key/value heads, SwiGLU 2048, V=16384, untied head), N = 1024 tokens (B=4, T=256).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "tessera/kernels/bf16.h"
#include "tessera/kernels/blas_setup.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/precision.h"

namespace {

struct Options {
  std::string family = "llama";
  int layers = 12, dim = 768, heads = 12, kv_heads = 4, vocab = 16384, tokens = 1024;
  int ffn = 0;  // 0: the family's (llama 2048, gpt2 4 x dim)
  int threads = 1, rounds = 5;
  tessera::kernels::Precision precision = tessera::kernels::Precision::F32;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_step_gemms: %s\nusage: bench_step_gemms [--family llama|gpt2] [--layers L] "
               "[--dim C] [--heads H] [--kv-heads KV] [--ffn F] [--vocab V] [--tokens N] "
               "[--threads T] [--rounds R] [--precision fp32|bf16]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  const std::pair<const char*, int*> counts[] = {
      {"--layers", &o.layers},     {"--dim", &o.dim},         {"--heads", &o.heads},
      {"--kv-heads", &o.kv_heads}, {"--ffn", &o.ffn},         {"--vocab", &o.vocab},
      {"--tokens", &o.tokens},     {"--threads", &o.threads}, {"--rounds", &o.rounds}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--family") {
      if (value != "llama" && value != "gpt2") usage("--family takes llama or gpt2");
      o.family = value;
      continue;
    }
    if (flag == "--precision") {
      try {
        o.precision = tessera::kernels::parse_precision(value);
      } catch (const std::exception& e) {
        usage(e.what());
      }
      continue;
    }
    const auto* it = std::find_if(std::begin(counts), std::end(counts),
                                  [&](const auto& c) { return flag == c.first; });
    if (it == std::end(counts)) usage(("unknown flag " + flag).c_str());
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (*end != '\0' || v <= 0 || v > INT_MAX)
      usage((flag + " takes a positive integer, not " + value).c_str());
    *it->second = static_cast<int>(v);
  }
  if (o.family == "gpt2") o.kv_heads = o.heads;
  if (o.ffn == 0) o.ffn = o.family == "gpt2" ? 4 * o.dim : 2048;
  if (o.dim % o.heads != 0) usage("--dim must be a multiple of --heads");
  if (o.heads % o.kv_heads != 0) usage("--heads must be a multiple of --kv-heads");
  return o;
}

// A dense layer in[M, K] . W[K, N]; transposed_weight: the tied head, W stored [N, K].
struct Layer {
  int K, N;
  bool transposed_weight = false;
};

std::vector<Layer> step_layers(const Options& o) {
  const int C = o.dim, kv = C / o.heads * o.kv_heads;
  const int mlp_in = o.family == "llama" ? 2 * o.ffn : o.ffn;  // SwiGLU: gate and up as one GEMM
  std::vector<Layer> layers;
  for (int l = 0; l < o.layers; ++l) {
    layers.push_back({C, C + 2 * kv});  // q, k, v as one GEMM
    layers.push_back({C, C});           // attention output
    layers.push_back({C, mlp_in});
    layers.push_back({o.ffn, C});
  }
  layers.push_back({C, o.vocab, o.family == "gpt2"});  // the head (tied to the embedding for gpt2)
  return layers;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  tessera::kernels::use_fast_blas_kernels(argv);
  const Options o = parse(argc, argv);
  openblas_set_num_threads(o.threads);
  namespace k = tessera::kernels;
  const std::vector<Layer> layers = step_layers(o);
  size_t widest = 0, largest_weight = 0;
  double flops = 0;
  for (const Layer& l : layers) {
    widest = std::max<size_t>(widest, static_cast<size_t>(std::max(l.K, l.N)));
    largest_weight = std::max(largest_weight, static_cast<size_t>(l.K) * l.N);
    flops += 6.0 * o.tokens * l.K * l.N;
  }
  const int M = o.tokens;
  // One buffer per role, as large as the largest layer needs; values of a trained network's scale.
  std::vector<float> in(static_cast<size_t>(M) * widest, 0.5f), out(in.size(), 0.0f),
      dout(in.size(), 1e-3f), din(in.size(), 0.0f), w(largest_weight, 0.02f),
      dw(largest_weight, 0.0f);
  std::vector<uint16_t> w_bf16(w.size());
  k::f32_to_bf16(w_bf16.data(), w.data(), static_cast<int64_t>(w.size()));
  const bool bf16 = o.precision == k::Precision::BF16;
  const k::GemmInput weight = bf16 ? k::GemmInput(w_bf16.data()) : k::GemmInput(w.data());
  const k::GemmModeScope mode(
      k::GemmMode{o.precision, bf16 ? k::resolve_bf16_gemm(k::Bf16Gemm::Auto) : k::Bf16Gemm::Auto});
  std::vector<double> times;
  for (int r = 0; r <= o.rounds; ++r) {  // round 0 warms up
    const double start = now();
    for (const Layer& l : layers) {
      const int K = l.K, N = l.N;
      if (l.transposed_weight) {
        k::matmul_nt_forward(out.data(), in.data(), weight, M, K, N);
        k::matmul_nt_backward(din.data(), dw.data(), dout.data(), in.data(), weight, M, K, N);
      } else {
        k::matmul_forward(out.data(), in.data(), weight, nullptr, nullptr, M, K, N);
        k::matmul_backward(din.data(), dw.data(), nullptr, dout.data(), in.data(), weight, M, K, N);
      }
    }
    if (r > 0) times.push_back(now() - start);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf(
      "{\"family\": \"%s\", \"precision\": \"%s\", \"threads\": %d, \"tokens\": %d, "
      "\"gemm_seconds\": %.4f, "
      "\"gflop\": %.1f, \"gflop_per_s\": %.1f, \"tokens_per_s\": %.1f, \"gemms\": \"%s\"}\n",
      o.family.c_str(), k::to_string(o.precision), o.threads, o.tokens, median, flops * 1e-9,
      flops * 1e-9 / median, o.tokens / median,
      (bf16 ? k::describe(k::current_gemm_mode()) : "fp32 OpenBLAS " + k::blas_core_name())
          .c_str());
  return 0;
}
