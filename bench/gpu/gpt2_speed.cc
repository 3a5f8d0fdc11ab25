// GPT-2 training speed on one GPU (cuda/gpt.h): tokens/s and MFU of whole steps (forward,
// backward, gradient clipping, AdamW) at a given batch and sequence length, the median over timed
// steps after warm-up. MFU = tokens/s x model FLOPs per token (nn::model_flops_per_token: 6 N +
// 6 L C T, causal) / the device's dense bf16 peak (cuda::bf16_peak_flops). Random tokens: the
// speed does not depend on the text.
//
//   gpt2_speed [--batch 16] [--seq 1024] [--steps 20] [--warmup 3] [--precision bf16]
//              [--layers 12 --heads 12 --width 768 --vocab 50257]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/cuda/gpt.h"
#include "tessera/nn/gpt.h"
#include "tessera/nn/gpt_costs.h"

int main(int argc, char** argv) {
  using namespace tessera;
  CLI::App app{"GPT-2 training speed on one CUDA device"};
  int B = 16, T = 1024, steps = 20, warmup = 3;
  std::string precision = "bf16";
  bool profile = false;
  nn::GPTConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.block_size = 1024;
  c.vocab_size = 50257;
  app.add_option("--batch", B, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--seq", T, "tokens per sequence")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--precision", precision, "fp32 or bf16");
  app.add_option("--layers", c.n_layer, "blocks");
  app.add_option("--heads", c.n_head, "attention heads");
  app.add_option("--width", c.n_embd, "model width");
  app.add_option("--vocab", c.vocab_size, "vocabulary");
  app.add_flag("--profile", profile,
               "time every operation with CUDA events and print the breakdown (adds a little "
               "time of its own)");
  CLI11_PARSE(app, argc, argv);
  try {
    c.block_size = std::max(c.block_size, T);
    if (!cuda::available()) {
      std::fprintf(stderr, "gpt2_speed: no CUDA device\n");
      return 2;
    }
    const cuda::DeviceInfo dev = cuda::device_info(0);
    // The layout and initial values from a CPU model of one row (its parameters only matter).
    Allocator host("cpu layout");
    nn::GPT layout(c, 1, host, nn::GPTLayout{});
    layout.initialize(1);
    cuda::GptOptions o;
    o.precision = cuda::parse_precision(precision);
    o.max_batch = B;
    o.seq_len = T;
    o.profile = profile;
    cuda::Gpt gpu(c, layout.params(), layout.params().flat_params().f32(), o);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = tok(rng);
    for (size_t i = 0; i + 1 < tokens.size(); ++i) targets[i] = tokens[i + 1];
    targets.back() = tok(rng);
    const optim::AdamWConfig adam;
    std::vector<double> seconds;
    std::printf("device %s, %d SMs, %.1f GiB; GPT-2 %d layers x %d wide, V %d; B %d T %d %s\n",
                dev.name.c_str(), dev.sm_count, static_cast<double>(dev.total_bytes) / (1 << 30),
                c.n_layer, c.n_embd, c.vocab_size, B, T, precision.c_str());
    for (int s = 0; s < warmup + steps; ++s) {
      gpu.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      gpu.zero_grads();
      const double loss = gpu.forward_backward(
          nn::Batch{tokens.data(), targets.data(), B, T, 0},
          nn::StepContext{1, static_cast<uint64_t>(s), true, 1.0f / static_cast<float>(B * T)});
      const double norm = std::sqrt(gpu.grad_sum_squares());
      if (norm > 1.0) gpu.scale_grads(static_cast<float>(1.0 / norm));
      gpu.adamw_step(adam, 6e-4f);
      gpu.synchronize();
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) seconds.push_back(dt);
      std::printf("step %2d loss %.4f norm %.3f %.1f ms%s\n", s, loss / (B * T), norm, dt * 1e3,
                  s < warmup ? " (warm-up)" : "");
    }
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    const double tps = static_cast<double>(B) * T / med;
    const double flops = nn::model_flops_per_token(c, T);
    const double peak = cuda::bf16_peak_flops(dev);
    std::printf("median step %.2f ms over %d steps: %.0f tokens/s", med * 1e3, steps, tps);
    if (peak > 0)
      std::printf(", MFU %.1f%% of %.0f TFLOP/s (%.1f GFLOP per token)", 100.0 * tps * flops / peak,
                  peak / 1e12, flops / 1e9);
    std::printf("\npeak device memory %.2f GiB\n",
                static_cast<double>(gpu.allocator().peak()) / (1 << 30));
    if (profile)
      std::printf("profile, summed over all %d steps (warm-up included):\n%s", warmup + steps,
                  gpu.profile().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt2_speed: %s\n", e.what());
    return 1;
  }
  return 0;
}
