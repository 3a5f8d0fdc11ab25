// Causal attention forward + backward on one thread (GPT-2 small's heads by default: 12 x 64,
// B = 1): the fused kernel (flash_attention_forward, _delta, _backward) or the materialising one
// (attention_forward / attention_backward, which hold [heads, T, T] probabilities and [T, T] of
// scratch). One kernel and one T per run, so that the process's peak resident memory is the
// kernel's: the figure printed is the growth of VmHWM over the inputs and outputs (q, k, v, dout,
// out and the gradients, allocated and touched first), which counts what the kernel itself needs
// (lse and delta, or the probabilities and scratch; tile scratch; OpenBLAS's buffers).
// Usage: bench_attention flash|materialising T [heads (12)] [head size (64)] [repeats (3)]
// Prints one JSON line: the seconds of each repeat (after one warm-up) and their median, wall
// clock and the process's CPU time (the latter is what a loaded machine disturbs least).
#include <cblas.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tessera/kernels/attention.h"
#include "tessera/kernels/blas_setup.h"
#include "tessera/kernels/flash_attention.h"

namespace {

namespace k = tessera::kernels;
using Clock = std::chrono::steady_clock;

// The process's peak resident set (VmHWM), in bytes.
long long peak_rss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return 0;
}

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (v[(n - 1) / 2] + v[n / 2]) / 2;
}

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  k::use_fast_blas_kernels(argv);
  openblas_set_num_threads(1);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s flash|materialising T [heads] [head size] [repeats]\n",
                 argv[0]);
    return 2;
  }
  const std::string impl = argv[1];
  const int T = std::atoi(argv[2]);
  const int NH = argc > 3 ? std::atoi(argv[3]) : 12;
  const int hs = argc > 4 ? std::atoi(argv[4]) : 64;
  const int repeats = argc > 5 ? std::atoi(argv[5]) : 3;
  if ((impl != "flash" && impl != "materialising") || T <= 0 || NH <= 0 || hs <= 0) {
    std::fprintf(stderr, "bench_attention: bad arguments\n");
    return 2;
  }
  const k::AttentionHeads heads{NH, NH, hs};
  const int C = NH * hs, W = heads.row_width();
  // Inputs and outputs, touched: packed qkv [T, 3C] (the materialising kernel's layout; the fused
  // one reads it through strides), dout and out [T, C], dqkv [T, 3C].
  const std::vector<float> qkv = random_values(static_cast<size_t>(T) * W, 1);
  const std::vector<float> dout = random_values(static_cast<size_t>(T) * C, 2);
  std::vector<float> out(static_cast<size_t>(T) * C, 0.0f), dqkv(qkv.size(), 0.0f);
  const long long base = peak_rss();

  std::vector<double> seconds, cpu;
  if (impl == "flash") {
    std::vector<float> lse(static_cast<size_t>(NH) * T), delta(lse.size());
    k::FlashAttention a;
    a.B = 1;
    a.Tq = a.Tk = T;
    a.heads = heads;
    a.q = qkv.data();
    a.ldq = W;
    a.k = qkv.data() + C;
    a.v = qkv.data() + 2 * C;
    a.ldkv = W;
    for (int r = 0; r <= repeats; ++r) {
      const auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      k::flash_attention_forward(a, out.data(), C, lse.data());
      k::flash_attention_delta(delta.data(), out.data(), C, dout.data(), C, 1, T, heads);
      std::fill(dqkv.begin(), dqkv.end(), 0.0f);
      k::flash_attention_backward(a, dout.data(), C, lse.data(), delta.data(), dqkv.data(), W,
                                  dqkv.data() + C, dqkv.data() + 2 * C, W);
      if (r > 0) {
        seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        cpu.push_back(cpu_seconds() - c0);
      }
    }
  } else {
    std::vector<float> att(static_cast<size_t>(NH) * T * T), scratch(static_cast<size_t>(T) * T);
    for (int r = 0; r <= repeats; ++r) {
      const auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      k::attention_forward(out.data(), att.data(), nullptr, qkv.data(), 1, T, heads);
      k::attention_backward(dqkv.data(), scratch.data(), dout.data(), att.data(), nullptr,
                            qkv.data(), 1, T, heads);
      if (r > 0) {
        seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        cpu.push_back(cpu_seconds() - c0);
      }
    }
  }
  const long long extra = peak_rss() - base;
  double checksum = 0;
  for (size_t i = 0; i < dqkv.size(); i += 97) checksum += dqkv[i];
  std::printf("{\"impl\": \"%s\", \"T\": %d, \"heads\": %d, \"head_size\": %d, \"seconds\": [",
              impl.c_str(), T, NH, hs);
  for (size_t i = 0; i < seconds.size(); ++i) std::printf("%s%.4f", i ? ", " : "", seconds[i]);
  std::printf(
      "], \"median_s\": %.4f, \"median_cpu_s\": %.4f, \"extra_mib\": %.1f, "
      "\"checksum\": %.6g}\n",
      median(seconds), median(cpu), static_cast<double>(extra) / (1 << 20), checksum);
  return 0;
}
