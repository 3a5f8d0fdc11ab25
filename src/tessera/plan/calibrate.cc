#include "tessera/plan/calibrate.h"

#include <cblas.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <tuple>
#include <vector>

#include "tessera/comm/bench.h"
#include "tessera/comm/launch.h"
#include "tessera/core/cpu_time.h"
#include "tessera/core/error.h"
#include "tessera/kernels/attention.h"
#include "tessera/kernels/blas_setup.h"
#include "tessera/kernels/flash_attention.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/kernels/residual.h"
#include "tessera/kernels/softmax_xent.h"
#include "tessera/nn/gpt_costs.h"
#include "tessera/optim/adamw.h"

namespace tessera::plan {

namespace {

// Compute rates are timed in this thread's CPU time (core/cpu_time.h): a device is one core, and
// the rate of a core does not change when other tenants of a shared machine take turns on it.
double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Seconds of one row-major C[M,N] (+)= op(A) op(B), median of `reps` after a warm-up.
double time_gemm(bool ta, bool tb, int M, int N, int K, int reps) {
  std::vector<float> a(static_cast<size_t>(M) * K, 0.5f), b(static_cast<size_t>(K) * N, 0.25f),
      c(static_cast<size_t>(M) * N, 0.0f);
  const int lda = ta ? M : K, ldb = tb ? K : N;
  kernels::sgemm(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), N);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = thread_cpu_seconds();
    kernels::sgemm(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), N);
    t.push_back(thread_cpu_seconds() - t0);
  }
  return median(t);
}

// Seconds of one call of `f`, median of `reps` after a warm-up.
template <typename F>
double time_call(int reps, F f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = thread_cpu_seconds();
    f();
    t.push_back(thread_cpu_seconds() - t0);
  }
  return median(t);
}

// Operands of the grid's GEMMs, each call at the next offset of a 64 MiB pool per operand, so
// that they come from beyond the core's L2 as a large micro-batch's do in the trainer (on a
// Sapphire Rapids core, the L=4 C=256 projections at 1024 rows ran 9-19% slower so than hot).
struct OperandPools {
  static constexpr size_t kFloats = size_t{16} << 20;
  std::vector<float> a = std::vector<float>(kFloats, 0.5f), b = std::vector<float>(kFloats, 0.25f),
                     c = std::vector<float>(kFloats, 0.0f);
  size_t next = 0;
  bool cold = true;  // false: every call on the pool's start
  // The offset for operands of up to `n` floats, 4 KiB-aligned, wrapping around the pool.
  size_t offset(size_t n) {
    if (!cold) return 0;
    const size_t step = (n + 1023) / 1024 * 1024;
    if (next + step > kFloats) next = 0;
    const size_t at = next;
    next += step;
    return at;
  }
};

// Seconds of one C[M,N] = A[M,K] B[K,N] (row-major, packed): calls repeated to at least ~0.5 ms
// of work per sample, median of `reps` samples.
double time_small_gemm(int M, int N, int K, int reps, OperandPools& p) {
  const double flops = 2.0 * M * N * K;
  const int calls = static_cast<int>(std::max(1.0, std::ceil(5e7 / flops)));
  const size_t n = static_cast<size_t>(std::max({M * K, K * N, M * N}));
  auto once = [&] {
    for (int i = 0; i < calls; ++i) {
      const size_t at = p.offset(n);
      kernels::sgemm(false, false, M, N, K, 1.0f, p.a.data() + at, K, p.b.data() + at, N, 0.0f,
                     p.c.data() + at, N);
    }
  };
  return time_call(reps, once) / calls;
}

// The efficiency grids (gemm_efficiency.h): every (M, N, K) of `dims`, operands in cache and
// beyond it, timed against `peak`.
GemmEfficiency measure_gemm_grid(const std::vector<double>& dims, double peak, int reps) {
  OperandPools pools;
  std::vector<double> hot, cold;
  for (bool is_cold : {false, true}) {
    pools.cold = is_cold;
    for (double M : dims)
      for (double N : dims)
        for (double K : dims) {
          const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
          const double rate = 2.0 * M * N * K / time_small_gemm(m, n, k, reps, pools);
          (is_cold ? cold : hot).push_back(std::clamp(rate / peak, 0.01, 2.0));
        }
  }
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return GemmEfficiency(dims, std::move(hot), std::move(cold), l2 > 0 ? double(l2) : 1048576.0);
}

// The model's attention kernel (the fused one, kernels/flash_attention.h) on one causal sequence
// of `heads` heads at context T and head size hs (no dropout): the rate of its FLOPs as plan/work.h
// counts them (4 hs per computed score forward; backward twice that and the Q K^T it reruns,
// nn::BlockFlops::attention_core_recompute), softmax included, over `peak`.
std::pair<double, double> attention_rate(int T, int hs, int reps, double peak) {
  const int heads = 4, C = heads * hs;
  std::vector<float> qkv(static_cast<size_t>(T) * 3 * C, 0.1f), dqkv(qkv.size()),
      out(static_cast<size_t>(T) * C), dout(out.size(), 0.01f), lse(static_cast<size_t>(heads) * T),
      delta(lse.size());
  double scores = 0;
  for (int r0 = 0; r0 < T; r0 += kernels::kAttentionBlock) {
    const int r1 = std::min(T, r0 + kernels::kAttentionBlock);
    scores += static_cast<double>(r1 - r0) * r1;
  }
  const double flops = 4.0 * hs * heads * scores;
  const nn::BlockFlops per_token = nn::block_flops(nn::GPTConfig{}, 0, T);
  const double bwd_flops =
      (2 + per_token.attention_core_recompute / per_token.attention_core) * flops;
  const int calls = static_cast<int>(std::max(1.0, std::ceil(5e7 / flops)));
  kernels::FlashAttention a;
  a.B = 1;
  a.Tq = a.Tk = T;
  a.heads = kernels::AttentionHeads::multi_head(C, heads);
  a.q = qkv.data();
  a.k = a.q + C;
  a.v = a.q + 2 * C;
  a.ldq = a.ldkv = 3 * C;
  const double fwd = time_call(reps, [&] {
    for (int i = 0; i < calls; ++i) kernels::flash_attention_forward(a, out.data(), C, lse.data());
  });
  const double bwd = time_call(reps, [&] {
    for (int i = 0; i < calls; ++i) {
      std::fill(dqkv.begin(), dqkv.end(), 0.0f);
      kernels::flash_attention_delta(delta.data(), out.data(), C, dout.data(), C, 1, T, a.heads);
      kernels::flash_attention_backward(a, dout.data(), C, lse.data(), delta.data(), dqkv.data(),
                                        3 * C, dqkv.data() + C, dqkv.data() + 2 * C, 3 * C);
    }
  });
  return {flops * calls / fwd / peak, bwd_flops * calls / bwd / peak};
}

AttentionEfficiency measure_attention(bool quick, double peak, int reps) {
  AttentionEfficiency a;
  a.seq = quick ? std::vector<double>{64, 256} : std::vector<double>{64, 128, 256, 512, 1024, 2048};
  a.head_size = quick ? std::vector<double>{32, 64} : std::vector<double>{16, 32, 64, 128};
  for (double T : a.seq)
    for (double hs : a.head_size) {
      const auto [f, b] = attention_rate(static_cast<int>(T), static_cast<int>(hs), reps, peak);
      a.forward.push_back(std::clamp(f, 0.01, 2.0));
      a.backward.push_back(std::clamp(b, 0.01, 2.0));
    }
  return a;
}

struct Gemm {
  bool ta, tb;
  int M, N, K;
  double count;  // how often the model runs it per micro-batch and layer
};

// The GEMMs of one block per micro-batch (forward, input gradient, weight gradient) and the
// per-head attention tiles, as nn/block.cc and kernels/flash_attention.cc run them.
std::vector<Gemm> reference_gemms(const ModelSpec& m, int micro_batch) {
  const int BT = micro_batch * m.seq, C = m.hidden, hs = m.hidden / m.heads;
  const int Q = static_cast<int>(m.qkv()), F = static_cast<int>(m.ffn());
  const double up = m.arch == nn::Arch::Llama ? 2 : 1;  // SwiGLU's gate and up, or GELU's c_fc
  std::vector<Gemm> g;
  for (const auto& [K, N, n] : {std::tuple{C, Q, 1.0}, {C, C, 1.0}, {C, F, up}, {F, C, 1.0}}) {
    g.push_back({false, false, BT, N, K, n});  // forward
    g.push_back({false, true, BT, K, N, n});   // input gradient
    g.push_back({true, false, K, N, BT, n});   // weight gradient
  }
  // The fused attention's tiles (kernels/flash_attention.cc) per head: b = 64 queries against 64
  // keys up to the query tile's end; S = Q K^T (forward, the backward's again, and dP = dO V^T),
  // O += P V (and dQ += dS K), dV += P^T dO (and dK += dS^T Q).
  const int b = kernels::kAttentionBlock;
  double pairs = 0;
  for (int r0 = 0; r0 < m.seq; r0 += b) pairs += std::ceil(std::min(m.seq, r0 + b) / double(b));
  const double tiles = pairs * micro_batch * m.heads;
  g.push_back({false, true, b, b, hs, 3 * tiles});
  g.push_back({false, false, b, hs, b, 2 * tiles});
  g.push_back({true, false, b, hs, b, 2 * tiles});
  return g;
}

// The rate, in the planner's accounting of elementwise traffic (plan/work.h), of tessera's own
// non-matmul kernels on one micro-batch of the reference model: LayerNorm, GELU, the residual
// branch, the softmax cross-entropy, each forward and backward, and AdamW. On these CPUs such
// kernels are bound by their arithmetic as much as by memory, so a memcpy would overstate them.
double elementwise_rate(const ModelSpec& m, int micro_batch, int reps) {
  const int N = micro_batch * m.seq, C = m.hidden, F = 4 * m.hidden, V = m.vocab;
  std::vector<float> x(static_cast<size_t>(N) * F, 0.5f), y(x.size(), 0.0f), z(x.size(), 0.1f);
  std::vector<float> w(static_cast<size_t>(F), 1.0f), b(w.size(), 0.0f), dw(w.size()), db(w.size());
  std::vector<float> mean(static_cast<size_t>(N)), rstd(mean.size()), lse(mean.size()),
      loss(mean.size());
  std::vector<float> logits(static_cast<size_t>(N) * V, 0.01f);
  std::vector<int32_t> targets(static_cast<size_t>(N), 1);
  const double e = 4;
  double bytes = 0, seconds = 0;
  auto add = [&](double planner_bytes, double t) {
    bytes += planner_bytes;
    seconds += t;
  };
  // The planner counts 2 C e per LayerNorm forward and twice that backward, 3 C e per residual
  // branch, 8 C e per GELU forward (4C in and out), a forward read of the logits (V x 4 bytes)
  // and two passes backward.
  add(2 * N * C * e, time_call(reps, [&] {
        kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                   N, C, 1e-5f);
      }));
  add(4 * N * C * e, time_call(reps, [&] {
        kernels::layernorm_backward(z.data(), dw.data(), db.data(), y.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), N, C);
      }));
  add(3 * N * C * e, time_call(reps, [&] {
        kernels::bias_residual_forward(y.data(), x.data(), b.data(), z.data(), N, C);
      }));
  add(8.0 * N * C * e,
      time_call(reps, [&] { kernels::gelu_forward(y.data(), x.data(), 1LL * N * F); }));
  add(16.0 * N * C * e,
      time_call(reps, [&] { kernels::gelu_backward(z.data(), y.data(), x.data(), 1LL * N * F); }));
  add(1.0 * N * V * 4, time_call(reps, [&] {
        kernels::softmax_xent_forward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
      }));
  add(2.0 * N * V * 4, time_call(reps, [&] {
        kernels::softmax_xent_backward(logits.data(), logits.data(), lse.data(), targets.data(),
                                       1e-3f, N, V);
      }));
  // AdamW over the block's parameters: 28 bytes per element (p, g, m, v read; p, m, v written).
  const int64_t P = 12LL * C * C;
  std::vector<float> p(static_cast<size_t>(P), 0.1f), g(p.size(), 0.01f), mo(p.size()),
      ve(p.size());
  add(28.0 * P, time_call(reps, [&] {
        optim::adamw_update(p.data(), mo.data(), ve.data(), g.data(), P, 1e-3f, 0.9f, 0.95f, 1e-8f,
                            0.1f, 1);
      }));
  return bytes / seconds;
}

double gib_of_ram() {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return 8;
  return static_cast<double>(si.totalram) * si.mem_unit / 1073741824.0;
}

}  // namespace

nlohmann::json calibrate_link(comm::Communicator& world, bool quick, std::ostream* log) {
  comm::BenchOptions o;
  o.ops = {"all_reduce"};
  o.min_bytes = 4;
  o.max_bytes = size_t{64} << 20;
  o.iters = quick ? 5 : 20;
  o.min_iters = quick ? 2 : 5;
  o.warmup = quick ? 1 : 3;
  o.rotate_bytes = size_t{256} << 20;
  const std::vector<comm::BenchRow> rows = comm::bench_collectives(world, o, log);
  const int n = world.size();
  double small_us = 0, busbw = 0;
  std::vector<double> large;
  for (const comm::BenchRow& r : rows) {
    if (r.bytes == 4) small_us = r.median_us;
    if (r.bytes >= (size_t{16} << 20)) large.push_back(r.busbw_gbs);
  }
  if (!large.empty()) busbw = median(large);
  return {{"backend", std::string(world.backend())},
          {"ranks", n},
          {"bandwidth_gbs", busbw},
          {"latency_us", n > 1 ? small_us / (2.0 * (n - 1)) : 0.0},
          {"all_reduce_4B_us", small_us}};
}

ClusterSpec calibrate_this_machine(const CalibrationOptions& o, std::ostream* log) {
  validate(o.reference);
  openblas_set_num_threads(1);
  const int reps = o.quick ? 2 : 7;
  const int n = o.quick ? 512 : 2048;
  const double peak = 2.0 * n * n * n / time_gemm(false, false, n, n, n, reps);
  double flops = 0, seconds = 0;
  for (const Gemm& g : reference_gemms(o.reference, o.micro_batch)) {
    const double t = time_gemm(g.ta, g.tb, g.M, g.N, g.K, reps);
    flops += g.count * 2.0 * g.M * g.N * g.K;
    seconds += g.count * t;
  }
  const double efficiency = std::min(1.0, flops / seconds / peak);
  const double memcpy_gbs =
      comm::measure_memcpy_gbs(o.quick ? (size_t{32} << 20) : (size_t{256} << 20), o.quick ? 3 : 7);
  const double elementwise = elementwise_rate(o.reference, o.micro_batch, reps);
  // Log-spaced, 16 to 2048 (quick: 16 to 1024 by 4x); larger GEMMs take the edge's rate.
  const std::vector<double> dims = o.quick
                                       ? std::vector<double>{16, 64, 256, 1024}
                                       : std::vector<double>{16, 32, 64, 128, 256, 512, 1024, 2048};
  const GemmEfficiency grid = measure_gemm_grid(dims, peak, o.quick ? 1 : 3);
  const AttentionEfficiency attention = measure_attention(o.quick, peak, o.quick ? 1 : 3);
  if (log)
    *log << "sgemm " << n << "^3, 1 thread: " << peak / 1e9
         << " GFLOP/s; reference matmuls: " << flops / seconds / 1e9 << " GFLOP/s ("
         << 100 * efficiency << "%); elementwise kernels " << elementwise / 1e9
         << " GB/s (planner accounting); memcpy " << memcpy_gbs << " GB/s; gemm efficiency "
         << grid.at(64, 128, 32) << " at 64x128x32 (an attention block, head size 32) to "
         << grid.at(1024, 768, 256) << " at 1024x768x256 (a projection); attention kernel at "
         << "T=128 forward " << attention.at(false, 128, 32) << " (head size 32), "
         << attention.at(false, 128, 64) << " (64), backward " << attention.at(true, 128, 32)
         << ", " << attention.at(true, 128, 64) << "\n";
  nlohmann::json link;
  comm::run_inproc(o.ranks, [&](comm::Communicator& c) {
    nlohmann::json l = calibrate_link(c, o.quick, c.rank() == 0 ? log : nullptr);
    if (c.rank() == 0) link = l;
  });

  ClusterSpec c;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  c.name = "this-machine";
  c.description = detail::concat("measured by `tessera plan --calibrate` on ", host, ": ",
                                 std::thread::hardware_concurrency(),
                                 " cores, one tessera rank (one BLAS thread) per core, ",
                                 kernels::blas_core_name(), " OpenBLAS kernels");
  c.sources = {"tessera plan --calibrate (src/tessera/plan/calibrate.h)"};
  c.nodes = 1;
  c.devices_per_node = o.ranks;
  c.device_memory_gib = gib_of_ram() / o.ranks;
  c.peak_tflops["fp32"] = peak / 1e12;
  c.matmul_efficiency = efficiency;
  c.gemm_efficiency = grid;
  c.attention_efficiency = attention;
  c.memory_bandwidth_gbs = elementwise / 1e9;
  c.intra_node =
      LinkSpec{link.at("bandwidth_gbs").get<double>(), link.at("latency_us").get<double>()};
  c.inter_node = c.intra_node;  // one node
  c.engine = "tessera";
  c.precision = "fp32";
  c.dp_overlap = 0;  // the communicator's progress thread competes with the ranks for the cores
  c.reserved_gib = 0;
  c.calibration = {{"sgemm_2048_gflops", peak / 1e9},
                   {"reference_matmul_gflops", flops / seconds / 1e9},
                   {"reference_model", to_json(o.reference)},
                   {"reference_micro_batch", o.micro_batch},
                   {"memcpy_gbs", memcpy_gbs},
                   {"elementwise_gbs", elementwise / 1e9},
                   {"inproc", link}};
  return c;
}

ClusterSpec with_link(ClusterSpec c, const std::string& backend) {
  if (backend.empty() || backend == "inproc") return c;
  TESSERA_CHECK_AS(
      ConfigError, c.calibration.is_object() && c.calibration.contains(backend), "cluster '",
      c.name, "' has no calibration.", backend,
      " measurement; run `mpirun -np 2 tessera plan --calibrate --out FILE` to add it");
  const nlohmann::json& l = c.calibration.at(backend);
  c.intra_node = LinkSpec{l.at("bandwidth_gbs").get<double>(), l.at("latency_us").get<double>()};
  return c;
}

}  // namespace tessera::plan
