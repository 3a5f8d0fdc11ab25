// Single-rank engine benchmark (figures in docs/PERFORMANCE.md): in one run, (a) single-thread
// sgemm GFLOP/s at 2048^3 through the same BLAS, and (b) single-thread training steps (forward,
// backward, AdamW) for two GPT configurations: tokens/s and model FLOP/s (PaLM: 6 N + 12 L C T per
// token, N the parameter count without position embeddings) as a fraction of the sgemm rate.
//
// Usage: bench_engine [--steps N] [--warmup N] [--only small|large|recompute]
//                     [--recompute-steps N]
// --only recompute times none / selective / full activation recomputation on the large
// configuration (dropout 0.1) and prints activation bytes per block against the formula.
// OpenBLAS picks its kernels from the CPU it detects; on CPUs it does not know (a KVM guest
// reporting a new Xeon model) it may fall back to generic SSE3 ("Prescott") kernels. The core
// name is printed; OPENBLAS_CORETYPE=SkylakeX (or Haswell) selects the right ones.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/cpu_time.h"
#include "tessera/kernels/blas_setup.h"
#include "tessera/nn/gpt.h"
#include "tessera/optim/adamw.h"

namespace {

// Wall-clock and this thread's CPU time. Everything runs on the calling thread (BLAS with one
// thread), so CPU time is the work itself, robust to other processes sharing the cores; wall
// time is what a user sees. Both are reported.
struct Stamp {
  double wall, cpu;
  static Stamp now() {
    return {
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(),
        tessera::thread_cpu_seconds()};
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Rate {
  double wall, cpu;  // GFLOP/s
};

// The reference: single-thread sgemm at n^3. Timed on its own and also once after every timed
// training step, so that the ratio compares rates measured under the same machine conditions.
class SgemmProbe {
 public:
  explicit SgemmProbe(int n) : n_(n), a_(static_cast<size_t>(n) * n), b_(a_.size()), c_(a_.size()) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float& x : a_) x = d(rng);
    for (float& x : b_) x = d(rng);
    run();  // warm-up
    wall_.clear();
    cpu_.clear();
  }
  void run() {
    const Stamp t0 = Stamp::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_, n_, n_, 1.0f, a_.data(), n_,
                b_.data(), n_, 0.0f, c_.data(), n_);
    const Stamp t1 = Stamp::now();
    wall_.push_back(t1.wall - t0.wall);
    cpu_.push_back(t1.cpu - t0.cpu);
  }
  // Median rate over the runs since the last reset.
  Rate rate() const {
    const double flop = 2.0 * n_ * n_ * static_cast<double>(n_);
    return {flop / median(wall_) / 1e9, flop / median(cpu_) / 1e9};
  }
  void reset() {
    wall_.clear();
    cpu_.clear();
  }

 private:
  int n_;
  std::vector<float> a_, b_, c_;
  std::vector<double> wall_, cpu_;
};

struct Result {
  std::string name;
  int64_t params;
  double step_s, step_cpu_s, fwd_s, bwd_s, opt_s, tokens_per_s, model_gflops, model_gflops_cpu,
      loss;
  Rate sgemm;  // interleaved with the steps
};

Result bench_gpt(const char* name, const tessera::nn::GPTConfig& cfg, int B, int warmup, int steps,
                 SgemmProbe& probe) {
  tessera::Allocator alloc("bench");
  tessera::nn::GPT model(cfg, B, alloc);
  model.initialize(1337);
  tessera::optim::AdamW opt(model.params(), tessera::optim::AdamWConfig{}, alloc);
  const int T = cfg.block_size;
  std::vector<int32_t> data(static_cast<size_t>(B) * T + 1);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, cfg.vocab_size - 1);
  for (int32_t& x : data) x = tok(rng);
  tessera::nn::Batch batch{data.data(), data.data() + 1, B, T, 0};
  std::vector<double> fwd, bwd, opt_t, total, total_cpu;
  probe.reset();
  double loss = 0.0;
  for (int s = 0; s < warmup + steps; ++s) {
    tessera::nn::StepContext ctx{1, static_cast<uint64_t>(s), true, 1.0f / (B * T)};
    const Stamp t0 = Stamp::now();
    model.params().zero_grads();
    loss = model.forward(batch, ctx) / (B * T);
    const Stamp t1 = Stamp::now();
    model.backward();
    const Stamp t2 = Stamp::now();
    opt.step(1e-4f);
    const Stamp t3 = Stamp::now();
    if (s < warmup) continue;
    fwd.push_back(t1.cpu - t0.cpu);
    bwd.push_back(t2.cpu - t1.cpu);
    opt_t.push_back(t3.cpu - t2.cpu);
    total.push_back(t3.wall - t0.wall);
    total_cpu.push_back(t3.cpu - t0.cpu);
    probe.run();
  }
  Result r;
  r.name = name;
  r.params = model.num_params_without_wpe();
  r.step_s = median(total);
  r.step_cpu_s = median(total_cpu);
  r.fwd_s = median(fwd);
  r.bwd_s = median(bwd);
  r.opt_s = median(opt_t);
  r.tokens_per_s = B * T / r.step_s;
  r.model_gflops = model.flops_per_token(T) * B * T / r.step_s / 1e9;
  r.model_gflops_cpu = model.flops_per_token(T) * B * T / r.step_cpu_s / 1e9;
  r.loss = loss;
  r.sgemm = probe.rate();
  return r;
}

// Activation recomputation on one configuration: one model per mode, their steps interleaved
// (none, selective, full, none, ...) so machine drift hits every mode alike. Prints each mode's
// median step time and its ratio to none, and the activation bytes per block measured by the
// allocator against the fp32 formula (tests/nn/modules_test.cc derives it):
//   none       b s (64 h + 16 + 2 h [masks] + 4 a [the fused attention's log-sum-exp])
//   selective  b s (60 h + 16 + 2 h [masks]) (the attention output and log-sum-exp recomputed)
//   full       4 b s h
void bench_recompute(const tessera::nn::GPTConfig& cfg, int B, int warmup, int steps) {
  using tessera::nn::Recompute;
  const Recompute modes[] = {Recompute::None, Recompute::Selective, Recompute::Full};
  struct Mode {
    std::unique_ptr<tessera::Allocator> alloc;
    std::unique_ptr<tessera::nn::GPT> model;
    std::unique_ptr<tessera::nn::StageRecord> rec;
    std::vector<double> wall;
    double act_bytes_per_block = 0;
  };
  const int T = cfg.block_size;
  std::vector<int32_t> data(static_cast<size_t>(B) * T + 1);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, cfg.vocab_size - 1);
  for (int32_t& x : data) x = tok(rng);
  const tessera::nn::Batch batch{data.data(), data.data() + 1, B, T, 0};
  std::vector<Mode> ms(3);
  for (int i = 0; i < 3; ++i) {
    tessera::nn::GPTLayout layout;
    layout.recompute = modes[i];
    // Activation bytes per block: a record of an L-block model minus one of L-1 blocks.
    auto record_bytes = [&](int layers) {
      tessera::nn::GPTConfig c = cfg;
      c.n_layer = layers;
      tessera::Allocator a("probe");
      tessera::nn::GPT m(c, B, a, layout);
      const size_t before = a.in_use(tessera::MemCategory::Activations);
      auto r = m.make_record();
      return static_cast<double>(a.in_use(tessera::MemCategory::Activations) - before);
    };
    ms[i].act_bytes_per_block = record_bytes(cfg.n_layer) - record_bytes(cfg.n_layer - 1);
    ms[i].alloc = std::make_unique<tessera::Allocator>("bench");
    ms[i].model = std::make_unique<tessera::nn::GPT>(cfg, B, *ms[i].alloc, layout);
    ms[i].model->initialize(1337);
    ms[i].rec = ms[i].model->make_record();
  }
  double losses[3] = {0, 0, 0};
  for (int s = 0; s < warmup + steps; ++s) {
    for (int i = 0; i < 3; ++i) {
      tessera::nn::StepContext ctx{1, static_cast<uint64_t>(s), true, 1.0f / (B * T)};
      const Stamp t0 = Stamp::now();
      ms[i].model->params().zero_grads();
      losses[i] = ms[i].model->forward(ctx, batch, *ms[i].rec);
      ms[i].model->backward(*ms[i].rec);
      const Stamp t1 = Stamp::now();
      if (s >= warmup) ms[i].wall.push_back(t1.wall - t0.wall);
    }
  }
  const double b = B, sq = T, h = cfg.n_embd, a = cfg.n_head;
  const double masks = cfg.dropout > 0 ? 2 * b * sq * h : 0;
  const double formula[3] = {b * sq * (64 * h + 16 + 4 * a) + masks, b * sq * (60 * h + 16) + masks,
                             4 * b * sq * h};
  std::printf(
      "\nrecompute (L%d C%d H%d T%d V%d B%d, dropout %.2f; forward + backward, steps "
      "interleaved across modes, median of %d):\n",
      cfg.n_layer, cfg.n_embd, cfg.n_head, T, cfg.vocab_size, B, cfg.dropout, steps);
  std::printf("%-10s %10s %9s %14s %14s %8s %s\n", "mode", "step ms", "vs none", "act MiB/block",
              "formula MiB", "error", "loss (equal in every mode)");
  const double none_ms = median(ms[0].wall) * 1e3;
  for (int i = 0; i < 3; ++i) {
    const double ms_i = median(ms[i].wall) * 1e3;
    std::printf("%-10s %10.1f %8.2fx %14.3f %14.3f %7.2f%% %.9g\n",
                tessera::nn::to_string(modes[i]), ms_i, ms_i / none_ms,
                ms[i].act_bytes_per_block / 1048576.0, formula[i] / 1048576.0,
                100.0 * (ms[i].act_bytes_per_block - formula[i]) / formula[i], losses[i]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  tessera::kernels::use_fast_blas_kernels(argv);
  int steps = 10, warmup = 2;
  std::string only;  // "small" or "large": profile one configuration; "recompute": that part only
  int recompute_steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--warmup") == 0) warmup = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    if (std::strcmp(argv[i], "--recompute-steps") == 0) recompute_steps = std::atoi(argv[i + 1]);
  }
  openblas_set_num_threads(1);
  std::printf("OpenBLAS: %s (core %s), 1 thread\n", openblas_get_config(), openblas_get_corename());
  SgemmProbe probe(2048);
  for (int i = 0; i < 5; ++i) probe.run();
  const Rate alone = probe.rate();
  std::printf(
      "sgemm 2048x2048x2048 alone: %.1f GFLOP/s wall, %.1f GFLOP/s CPU time (median of 5)\n\n",
      alone.wall, alone.cpu);

  tessera::nn::GPTConfig small;
  small.n_layer = 4, small.n_embd = 256, small.n_head = 4, small.block_size = 128,
  small.vocab_size = 512;
  tessera::nn::GPTConfig large;
  large.n_layer = 6, large.n_embd = 512, large.n_head = 8, large.block_size = 256,
  large.vocab_size = 4096;
  std::vector<Result> rs;
  std::vector<double> targets;
  if (only == "recompute") {
    large.dropout = 0.1f;
    bench_recompute(large, 4, 1, recompute_steps);
    return 0;
  }
  if (only != "large") {
    rs.push_back(bench_gpt("L4 C256 H4 T128 V512 B8", small, 8, warmup, steps, probe));
    targets.push_back(0.70);
  }
  if (only != "small") {
    rs.push_back(bench_gpt("L6 C512 H8 T256 V4096 B4", large, 4, warmup, steps, probe));
    targets.push_back(0.80);
  }
  std::printf("%-25s %9s %8s %8s %7s %7s %6s %9s %8s %8s %7s %8s %8s %7s %6s\n", "config",
              "N(no wpe)", "step ms", "cpu ms", "fwd", "bwd", "adamw", "tokens/s", "model", "sgemm",
              "ratio", "model", "sgemm", "ratio", "target");
  std::printf("%-25s %9s %8s %8s %7s %7s %6s %9s %8s %8s %7s %8s %8s %7s %6s\n", "", "", "(wall)",
              "(cpu)", "cpu ms", "cpu ms", "cpu ms", "(wall)", "GF/s wal", "GF/s wal", "(wall)",
              "GF/s cpu", "GF/s cpu", "(cpu)", "");
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    std::printf(
        "%-25s %9lld %8.1f %8.1f %7.1f %7.1f %6.1f %9.0f %8.1f %8.1f %6.0f%% %8.1f %8.1f %6.0f%% "
        "%5.0f%%\n",
        r.name.c_str(), static_cast<long long>(r.params), r.step_s * 1e3, r.step_cpu_s * 1e3,
        r.fwd_s * 1e3, r.bwd_s * 1e3, r.opt_s * 1e3, r.tokens_per_s, r.model_gflops, r.sgemm.wall,
        100.0 * r.model_gflops / r.sgemm.wall, r.model_gflops_cpu, r.sgemm.cpu,
        100.0 * r.model_gflops_cpu / r.sgemm.cpu, 100.0 * targets[i]);
  }
  std::printf(
      "\nmedian of %d steps after %d warm-up steps (zero_grads + forward + backward + "
      "tessera::optim::AdamW); model FLOP/s = (6 N + 12 L C T) tokens / step time; "
      "ratio = model FLOP/s / sgemm FLOP/s of the 2048^3 sgemm run once after each timed step "
      "(wall "
      "with wall, CPU time with CPU time)\n",
      steps, warmup);
  return 0;
}
