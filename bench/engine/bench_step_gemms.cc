// The GEMMs of one training step and nothing else: what a step could take if every other kernel
// were free. Runs, through the same sgemm the model calls (OpenBLAS), each dense layer's forward
// (in . W), input gradient (dout . W^T) and weight gradient (W += in^T . dout) on the shapes of a
// Llama-style or GPT-2 decoder, and prints the median over rounds of their summed time and the
// tokens/s that time allows. The attention core (query-key and probability-value products) is
// left out: it runs in the fused attention kernel, a small share at T = 256.
// A framework whose step is dominated by the same GEMMs cannot be more than
// (its step time) / (this time) times faster than another: bench/llama/vs_pytorch.sh prints that
// ceiling beside its ratios.
//
// Usage: bench_step_gemms [--family llama|gpt2] [--layers L] [--dim C] [--heads H]
//                         [--kv-heads KV] [--ffn F] [--vocab V] [--tokens N] [--threads T]
//                         [--rounds R]
// Defaults: the Llama-style benchmark model of bench/llama/vs_pytorch.sh (L=12, C=768, 12 query
// over 4 key/value heads, SwiGLU 2048, V=16384, untied head), N = 1024 tokens (B=4, T=256).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/kernels/blas_setup.h"
#include "tessera/kernels/gemm.h"

namespace {

struct Options {
  std::string family = "llama";
  int layers = 12, dim = 768, heads = 12, kv_heads = 4, ffn = 2048, vocab = 16384, tokens = 1024;
  int threads = 1, rounds = 5;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_step_gemms: %s\nusage: bench_step_gemms [--family llama|gpt2] [--layers L] "
               "[--dim C] [--heads H] [--kv-heads KV] [--ffn F] [--vocab V] [--tokens N] "
               "[--threads T] [--rounds R]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  bool ffn_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--family") {
      if (value != "llama" && value != "gpt2") usage("--family takes llama or gpt2");
      o.family = value;
      continue;
    }
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (*end != '\0' || v <= 0) usage((flag + " takes a positive integer, not " + value).c_str());
    const int n = static_cast<int>(v);
    if (flag == "--layers")
      o.layers = n;
    else if (flag == "--dim")
      o.dim = n;
    else if (flag == "--heads")
      o.heads = n;
    else if (flag == "--kv-heads")
      o.kv_heads = n;
    else if (flag == "--ffn")
      o.ffn = n, ffn_given = true;
    else if (flag == "--vocab")
      o.vocab = n;
    else if (flag == "--tokens")
      o.tokens = n;
    else if (flag == "--threads")
      o.threads = n;
    else if (flag == "--rounds")
      o.rounds = n;
    else
      usage(("unknown flag " + flag).c_str());
  }
  if (o.family == "gpt2") {
    if (!ffn_given) o.ffn = 4 * o.dim;
    o.kv_heads = o.heads;
  }
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
  std::vector<Layer> layers;
  for (int l = 0; l < o.layers; ++l) {
    if (o.family == "llama") {
      layers.push_back({C, C + 2 * kv});  // q, k, v as one GEMM
      layers.push_back({C, C});           // attention output
      layers.push_back({C, 2 * o.ffn});   // gate and up as one GEMM
      layers.push_back({o.ffn, C});       // down
    } else {
      layers.push_back({C, 3 * C});
      layers.push_back({C, C});
      layers.push_back({C, o.ffn});
      layers.push_back({o.ffn, C});
    }
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
  std::vector<double> times;
  for (int r = 0; r <= o.rounds; ++r) {  // round 0 warms up
    const double start = now();
    for (const Layer& l : layers) {
      const int K = l.K, N = l.N;
      if (l.transposed_weight) {  // out = in . W^T; din = dout . W; dW += dout^T . in
        k::sgemm(false, true, M, N, K, 1.0f, in.data(), K, w.data(), K, 0.0f, out.data(), N);
        k::sgemm(false, false, M, K, N, 1.0f, dout.data(), N, w.data(), K, 0.0f, din.data(), K);
        k::sgemm(true, false, N, K, M, 1.0f, dout.data(), N, in.data(), K, 1.0f, dw.data(), K);
      } else {  // out = in . W; din = dout . W^T; dW += in^T . dout
        k::sgemm(false, false, M, N, K, 1.0f, in.data(), K, w.data(), N, 0.0f, out.data(), N);
        k::sgemm(false, true, M, K, N, 1.0f, dout.data(), N, w.data(), N, 0.0f, din.data(), K);
        k::sgemm(true, false, K, N, M, 1.0f, in.data(), K, dout.data(), N, 1.0f, dw.data(), N);
      }
    }
    if (r > 0) times.push_back(now() - start);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf(
      "{\"family\": \"%s\", \"threads\": %d, \"tokens\": %d, \"gemm_seconds\": %.4f, "
      "\"gflop\": %.1f, \"gflop_per_s\": %.1f, \"tokens_per_s\": %.1f, \"blas\": \"%s\"}\n",
      o.family.c_str(), o.threads, o.tokens, median, flops * 1e-9, flops * 1e-9 / median,
      o.tokens / median, k::blas_core_name().c_str());
  return 0;
}
