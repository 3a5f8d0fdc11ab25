// The planner's context parallelism (plan/context_parallel.h, docs/PLANNER.md): each --cp-comm
// variant's transient buffers and bytes are those of a real call of the context-parallel attention
// (the allocator's Buffers peak and the cp group's traffic counters), layouts with cp and their
// errors, the JSON round trip, activation memory / cp, work / cp, gradients over dp x cp, the time
// model (ring hides behind the attention core on fast links, allgather and ulysses do not) and
// rankings that try cp only when asked. Memory against real runs: memory_validation_test.cc.
#include "tessera/plan/context_parallel.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/nn/context_parallel.h"
#include "tessera/nn/context_parallel_attention.h"
#include "tessera/plan/korthikanti.h"
#include "tessera/plan/planner.h"
#include "tessera/plan/report.h"

namespace tessera::plan {
namespace {

using nn::CpComm;

ModelSpec gpt2_small(int seq) {
  ModelSpec m;
  m.layers = 12, m.hidden = 768, m.heads = 12, m.seq = seq, m.vocab = 50257;
  return m;
}

const std::vector<CpComm> kComms = {CpComm::AllGather, CpComm::Ring, CpComm::Ulysses};

// A call of the context-parallel attention on n thread-ranks, each with its own allocator: the
// Buffers peak of its forward and of its backward, and the bytes it sent in each.
struct CallMeasure {
  double fwd_peak = 0, bwd_peak = 0, fwd_sent = 0, bwd_sent = 0;
};

// lent: floats of memory lent to the call (nn::ContextAttention::lent), lend_delta: its row term
// lent too.
CallMeasure measure_call(CpComm comm, int n, int B, const kernels::AttentionHeads& heads,
                         int64_t lent = 0, bool lend_delta = false) {
  const int64_t T = 24, Tl = T / n, R = B * Tl, W = heads.row_width(),
                Qw = int64_t{heads.q} * heads.size;
  std::mutex mu;
  CallMeasure got;
  comm::run_inproc(n, [&](comm::Communicator& g) {
    Allocator alloc("cp rank", 0);
    CurrentAllocatorScope scope(alloc);
    const nn::ContextSplit cp(g, comm);
    const std::vector<int64_t> pos = nn::context_positions(T, n, g.rank());
    std::vector<float> qkv(static_cast<size_t>(R * W)), dy(static_cast<size_t>(R * Qw));
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = 0.02f * static_cast<float>(i % 31) - 0.3f;
    nn::ContextAttention a;
    a.cp = &cp, a.B = B, a.T = static_cast<int>(Tl), a.seq_len = T, a.positions = pos.data();
    a.heads = heads, a.head_offset = 0, a.n_head = heads.q, a.label = "h.0";
    std::vector<float> lent_memory(static_cast<size_t>(lent)),
        lent_delta(lend_delta ? static_cast<size_t>(B * heads.q * Tl) : 0);
    if (lent > 0) a.lent = lent_memory.data(), a.lent_floats = lent;
    if (lend_delta) a.lent_delta = lent_delta.data();
    std::vector<float> out(static_cast<size_t>(R * Qw)), lse(static_cast<size_t>(B * heads.q * Tl));
    std::vector<float> dqkv(qkv.size());
    alloc.reset_peaks();
    nn::context_attention_forward(a, qkv.data(), out.data(), lse.data());
    const double fwd_peak = static_cast<double>(alloc.peak(MemCategory::Buffers));
    const double fwd_sent = g.traffic().total();
    alloc.reset_peaks();
    nn::context_attention_backward(a, qkv.data(), out.data(), lse.data(), dy.data(), dqkv.data());
    const double bwd_peak = static_cast<double>(alloc.peak(MemCategory::Buffers));
    const double bwd_sent = g.traffic().total() - fwd_sent;
    if (g.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      got = {fwd_peak, bwd_peak, fwd_sent, bwd_sent};
    }
  });
  return got;
}

// What nn/context_parallel_attention.cc allocates and sends, as the planner models it: every
// variant at n = 2, 3, 4 (Ulysses where the heads split), one and two sequences a micro-batch
// (all-gather reorders K and V when B > 1), dense and grouped-query heads, and Ulysses with more
// ranks than key/value heads (replicated).
TEST(ContextParallelPlan, TransientBuffersAndBytesAreWhatACallAllocatesAndSends) {
  const std::vector<kernels::AttentionHeads> shapes = {{4, 4, 8}, {4, 2, 8}, {4, 1, 16}};
  int checked = 0;
  for (CpComm comm : kComms)
    for (int n : {2, 3, 4})
      for (int B : {1, 2})
        for (const kernels::AttentionHeads& h : shapes) {
          if (comm == CpComm::Ulysses && (h.q % n != 0 || (h.kv % n != 0 && n % h.kv != 0)))
            continue;
          SCOPED_TRACE(std::string(nn::to_string(comm)) + " n=" + std::to_string(n) +
                       " B=" + std::to_string(B) + " heads " + std::to_string(h.q) + "/" +
                       std::to_string(h.kv) + "x" + std::to_string(h.size));
          CpShape s;
          s.n = n, s.comm = comm, s.batch = B, s.rows = B * 24.0 / n;
          s.q = h.q, s.kv = h.kv, s.head_size = h.size, s.elem = 4;
          const CallMeasure got = measure_call(comm, n, B, h);
          const CpTransient t = cp_transient_bytes(s);
          EXPECT_EQ(t.fwd, got.fwd_peak);
          EXPECT_EQ(t.bwd, got.bwd_peak);
          EXPECT_GE(t.bwd, t.fwd);  // the engine places the backward's on the ZeRO buckets
          const CpBytes b = cp_layer_bytes(s);
          EXPECT_EQ(b.fwd, got.fwd_sent);
          EXPECT_EQ(b.bwd, got.bwd_sent);
          ++checked;
        }
  EXPECT_EQ(checked, 2 * (3 * 2 * 3) + 2 * 2 * 3);  // ulysses: n = 2 and 4 (none at 3)
}

// Memory lent to the call (a block workspace's d_fc and delta, nn::ContextAttention::lent): the
// ring keeps as many of its K/V blocks and dK/dV parts there as fit whole and allocates the rest;
// every variant reads the lent row term instead of allocating one. The planner's bytes are still
// the call's allocator peak, to the byte; at n = 2 with two blocks lent (a GPT-2 block's d_fc) the
// ring allocates nothing.
TEST(ContextParallelPlan, LentMemoryHoldsWhatFitsOfTheRingsBlocks) {
  const std::vector<kernels::AttentionHeads> shapes = {{4, 4, 8}, {4, 2, 8}};
  int checked = 0;
  for (CpComm comm : kComms)
    for (int n : {2, 3, 4})
      for (int B : {1, 2})
        for (const kernels::AttentionHeads& h : shapes)
          for (double blocks : {0.0, 1.0, 1.5, 2.0, 3.0, 6.0})
            for (bool delta : {false, true}) {
              if (comm == CpComm::Ulysses && (h.q % n != 0 || (h.kv % n != 0 && n % h.kv != 0)))
                continue;
              if (comm != CpComm::Ring && blocks != 2.0) continue;  // they do not use it
              SCOPED_TRACE(std::string(nn::to_string(comm)) + " n=" + std::to_string(n) +
                           " B=" + std::to_string(B) + " kv heads " + std::to_string(h.kv) +
                           " blocks lent " + std::to_string(blocks) + (delta ? " delta lent" : ""));
              CpShape s;
              s.n = n, s.comm = comm, s.batch = B, s.rows = B * 24.0 / n;
              s.q = h.q, s.kv = h.kv, s.head_size = h.size, s.elem = 4;
              const double block = s.rows * 2 * h.kv * h.size;
              s.lent = blocks * block, s.lent_delta = delta;
              const CallMeasure got =
                  measure_call(comm, n, B, h, static_cast<int64_t>(s.lent), delta);
              const CpTransient t = cp_transient_bytes(s);
              EXPECT_EQ(t.fwd, got.fwd_peak);
              EXPECT_EQ(t.bwd, got.bwd_peak);
              if (comm == CpComm::Ring && n == 2 && blocks >= 2 && delta) {
                EXPECT_EQ(got.fwd_peak, 0);
                EXPECT_EQ(got.bwd_peak, 0);
              }
              const CpBytes b = cp_layer_bytes(s);  // lent memory changes no byte sent
              EXPECT_EQ(b.fwd, got.fwd_sent);
              EXPECT_EQ(b.bwd, got.bwd_sent);
              ++checked;
            }
  EXPECT_EQ(checked, 2 * (3 * 2 * 2) + 6 * 2 * (3 * 2 * 2) + 2 * (2 * 2 * 2));
}

TEST(ContextParallelPlan, TheHeaderFormulas) {
  // nn/context_parallel_attention.h in 4-byte floats: allgather 8 KV R (n-1) forward and twice
  // that backward (the all-gather again and the reduce-scatter), ring 8 KV R (n-1) forward and
  // 8 KV R (3n-3) in all, ulysses 4 (n-1) R (2 Q/n + 2 KV_n) forward and 4 (n-1) R (3 Q/n +
  // 4 KV_n + Q/(D n)) backward.
  CpShape s;
  s.n = 4, s.batch = 2, s.rows = 512, s.q = 8, s.kv = 4, s.head_size = 64, s.elem = 4;
  const double KV = 4 * 64, Q = 8 * 64, R = 512, n = 4, D = 64;
  s.comm = CpComm::AllGather;
  EXPECT_DOUBLE_EQ(cp_layer_bytes(s).fwd, 8 * KV * R * (n - 1));
  EXPECT_DOUBLE_EQ(cp_layer_bytes(s).bwd, 16 * KV * R * (n - 1));
  s.comm = CpComm::Ring;
  EXPECT_DOUBLE_EQ(cp_layer_bytes(s).fwd, 8 * KV * R * (n - 1));
  EXPECT_DOUBLE_EQ(cp_layer_bytes(s).fwd + cp_layer_bytes(s).bwd, 8 * KV * R * (3 * n - 3));
  s.comm = CpComm::Ulysses;
  EXPECT_DOUBLE_EQ(cp_layer_bytes(s).fwd, 4 * (n - 1) * R * (2 * Q / n + 2 * KV / n));
  EXPECT_DOUBLE_EQ(cp_layer_bytes(s).bwd, 4 * (n - 1) * R * (3 * Q / n + 4 * KV / n + Q / (D * n)));
  s.kv = 2;  // more ranks than key/value heads: one head each, replicated
  EXPECT_DOUBLE_EQ(cp_layer_bytes(s).fwd, 4 * (n - 1) * R * (2 * Q / n + 2 * D));
  s.n = 1;
  EXPECT_EQ(cp_layer_bytes(s).fwd + cp_layer_bytes(s).bwd, 0);
  EXPECT_EQ(cp_transient_bytes(s).bwd, 0);
}

TEST(ContextParallelPlan, LayoutProblemsJsonAndDevices) {
  ModelSpec m = gpt2_small(1024);
  Layout l;
  l.cp = 4;
  l.cp_comm = CpComm::Ring;
  EXPECT_TRUE(layout_problems(l, m, 16, true).empty());
  EXPECT_EQ(l.devices(), 4);
  EXPECT_EQ(l.gradient_ranks(), 4);
  l.dp = 2, l.tp = 2, l.pp = 2;
  EXPECT_EQ(l.devices(), 32);
  EXPECT_EQ(l.str(), "dp=2 tp=2 pp=2 cp=4 ring zero=0 1f1b mb=1 recompute=none");
  // 2 cp must divide the sequence.
  m.seq = 1020;
  l = Layout{};
  l.cp = 4;
  std::vector<std::string> p = layout_problems(l, m, 16, true);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("1020"), std::string::npos) << p[0];
  m.seq = 1024;
  l.cp = 0;
  EXPECT_FALSE(layout_problems(l, m, 16, true).empty());
  // Ulysses: cp divides a tensor-parallel rank's query heads (12 / 2 = 6: not 4)...
  l = Layout{};
  l.cp_comm = CpComm::Ulysses;
  l.cp = 4;
  EXPECT_TRUE(layout_problems(l, m, 16, true).empty());
  l.tp = 2;
  p = layout_problems(l, m, 16, true);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("ulysses"), std::string::npos) << p[0];
  l.cp_comm = CpComm::AllGather;  // any head count
  EXPECT_TRUE(layout_problems(l, m, 16, true).empty());
  // ... and divides the key/value heads or is a multiple of them (8 heads over 2 here).
  ModelSpec llama = m;
  llama.arch = nn::Arch::Llama;
  llama.heads = 8, llama.kv_heads = 2, llama.hidden = 512;
  l = Layout{};
  l.cp_comm = CpComm::Ulysses;
  l.cp = 4;  // 4 ranks share 2 key/value heads: replicated
  EXPECT_TRUE(layout_problems(l, llama, 16, true).empty());
  llama.kv_heads = 8, llama.heads = 24, llama.hidden = 768;
  l.cp = 6;  // divides 24 query heads, neither divides nor is a multiple of 8
  m = llama;
  m.seq = 1032;
  EXPECT_FALSE(layout_problems(l, m, 16, true).empty());
  // Mixtures of experts need nothing more.
  m = gpt2_small(1024);
  m.moe.experts = 4;
  l = Layout{};
  l.dp = 2, l.ep = 2, l.cp = 2;
  EXPECT_TRUE(layout_problems(l, m, 16, true).empty());

  // JSON: train's keys, and back.
  for (CpComm c : kComms) {
    l.cp_comm = c;
    const nlohmann::json j = to_json(l);
    EXPECT_EQ(j["cp"], 2);
    EXPECT_EQ(j["cp_comm"], nn::to_string(c));
    EXPECT_EQ(layout_from_json(j, "x.json"), l);
  }
  EXPECT_EQ(layout_from_json({{"cp", 3}, {"cp_comm", "ulysses"}}, "x.json").cp, 3);
  EXPECT_THROW(layout_from_json({{"cp_comm", "tree"}}, "x.json"), ConfigError);
  EXPECT_THROW(layout_from_json({{"cp", "2"}}, "x.json"), ConfigError);
  // A plan's JSON names the layout and the cp bytes and times.
  PlanRequest r;
  r.model = gpt2_small(2048);
  r.cluster = with_devices(load_cluster("dgx-h100"), 8);
  r.global_batch = 8;
  l = Layout{};
  l.cp = 2, l.cp_comm = CpComm::Ring, l.micro_batch = 1;
  const Prediction pr = plan_layout(r, l);
  ASSERT_TRUE(pr.ok());
  const nlohmann::json j = to_json(pr);
  EXPECT_EQ(layout_from_json(j["layout"], "plan.json"), l);
  EXPECT_GT(j["bytes_per_step"]["context_parallel"].get<double>(), 0);
  EXPECT_GT(j["pipeline_ranks"][0]["time"]["cp_comm"].get<double>(), 0);
  const std::string text = format_prediction(r, pr);
  EXPECT_NE(text.find("cp=2 ring"), std::string::npos) << text;
  EXPECT_NE(text.find("context-parallel"), std::string::npos) << text;
}

PlanRequest long_context(const std::string& engine) {
  PlanRequest r;
  r.model = gpt2_small(8192);
  r.cluster = with_devices(load_cluster("dgx-h100"), 8);
  r.engine = engine;
  r.precision = engine == "tessera" ? "fp32" : "bf16";
  r.global_batch = 8;
  return r;
}

Layout cp_layout(int cp, CpComm comm) {
  Layout l;
  l.cp = cp, l.cp_comm = comm, l.micro_batch = 1;
  return l;
}

// Activation memory / cp: the tessera engine measures a stage built over a context group (its
// records and workspace sized for s / cp rows), the megatron engine divides Korthikanti's terms.
TEST(ContextParallelPlan, ActivationsAreDividedByCp) {
  for (const std::string engine : {"tessera", "megatron"}) {
    const PlanRequest r = long_context(engine);
    const Prediction one = plan_layout(r, cp_layout(1, CpComm::AllGather));
    ASSERT_TRUE(one.ok());
    for (CpComm c : kComms) {
      SCOPED_TRACE(engine + " " + nn::to_string(c));
      const Prediction two = plan_layout(r, cp_layout(2, c)),
                       four = plan_layout(r, cp_layout(4, c));
      ASSERT_TRUE(two.ok() && four.ok());
      const double a1 = one.memory.activations, a2 = two.memory.activations,
                   a4 = four.memory.activations;
      std::printf("%-8s %-9s activations cp 1 / 2 / 4: %.4g / %.4g / %.4g GiB (%.3f, %.3f)\n",
                  engine.c_str(), nn::to_string(c), a1 / 1073741824, a2 / 1073741824,
                  a4 / 1073741824, a1 / a2, a2 / a4);
      EXPECT_NEAR(a1 / a2, 2.0, 0.02);
      EXPECT_NEAR(a2 / a4, 2.0, 0.02);
      if (engine == "tessera") {
        if (c == CpComm::Ring) {  // two K/V blocks fit in the workspace's d_fc: none allocated
          EXPECT_EQ(two.memory.buffers, 0);
          EXPECT_GT(four.memory.buffers, 0);  // five blocks in the backward
        } else {
          EXPECT_GT(two.memory.buffers, 0);  // the variant's transient buffers
        }
      } else {
        EXPECT_DOUBLE_EQ(a1 / a2, 2.0);  // every term / cp
      }
    }
  }
  LayerShape x;
  x.s = 8192, x.b = 1, x.h = 768, x.a = 12;
  const double whole = layer_activation_bytes(x, nn::Recompute::None);
  x.cp = 4;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(x, nn::Recompute::None) * 4, whole);
}

// Per micro-batch every token-wise FLOP and byte, and the attention core's FLOPs, are / cp; the
// step's hardware FLOPs are the same on any cp; the gradients are summed over dp x cp, so
// dp = 1, cp = 2 holds and sends what dp = 2 does (but ZeRO-3 gathers the parameters for each of
// its twice as many micro-batches).
TEST(ContextParallelPlan, WorkIsDividedByCpAndGradientsGoOverDpTimesCp) {
  const PlanRequest r = long_context("tessera");
  const std::unique_ptr<Engine> e = make_engine("tessera");
  const parallel::UnitRange whole{0, r.model.layers + 1};
  const StageSheet s1 = e->stage(r.model, cp_layout(1, CpComm::Ring), whole);
  const StageSheet s2 = e->stage(r.model, cp_layout(2, CpComm::Ring), whole);
  EXPECT_NEAR(s1.fwd_flops / s2.fwd_flops, 2.0, 1e-12);
  EXPECT_NEAR(s1.bwd_flops / s2.bwd_flops, 2.0, 1e-12);
  EXPECT_NEAR(s1.core_fwd_flops / s2.core_fwd_flops, 2.0, 1e-12);
  EXPECT_NEAR(s1.fwd_bytes / s2.fwd_bytes, 2.0, 1e-12);
  EXPECT_EQ(s2.cp_cores, r.model.layers);
  const Prediction p1 = plan_layout(r, cp_layout(1, CpComm::Ring));
  const Prediction p2 = plan_layout(r, cp_layout(2, CpComm::Ring));
  EXPECT_NEAR(p1.hardware_flops_per_step / p2.hardware_flops_per_step, 1.0, 1e-12);
  EXPECT_EQ(p1.model_flops_per_step, p2.model_flops_per_step);
  for (parallel::ZeroStage z : {parallel::ZeroStage::None, parallel::ZeroStage::OptimizerState,
                                parallel::ZeroStage::Parameters}) {
    Layout cp2 = cp_layout(2, CpComm::AllGather), dp2 = cp_layout(1, CpComm::AllGather);
    cp2.zero = dp2.zero = z;
    dp2.dp = 2;
    const Prediction a = plan_layout(r, cp2), b = plan_layout(r, dp2);
    EXPECT_GT(a.dp_bytes, 0);
    if (z == parallel::ZeroStage::Parameters)
      EXPECT_GT(a.dp_bytes, b.dp_bytes);
    else
      EXPECT_DOUBLE_EQ(a.dp_bytes, b.dp_bytes) << parallel::to_int(z);
    EXPECT_DOUBLE_EQ(a.memory.model_states(), b.memory.model_states()) << parallel::to_int(z);
  }
}

ClusterSpec with_link(double gbs) {
  ClusterSpec c = with_devices(load_cluster("dgx-h100"), 8);
  c.intra_node = LinkSpec{gbs, 2};
  return c;
}

// The time model: ring's transfers hide behind the attention core's compute until the link is too
// slow for them (then all but the compute shows), allgather and ulysses wait for every byte;
// slower links never make any variant faster.
TEST(ContextParallelPlan, RingHidesBehindTheCoreOnFastLinksAllgatherDoesNot) {
  CpShape s = cp_shape(gpt2_small(8192), cp_layout(2, CpComm::Ring), 4);
  const ClusterSpec fast = with_link(450);
  const Group g = cp_group(fast, cp_layout(2, CpComm::Ring));
  EXPECT_EQ(g.size, 2);
  EXPECT_EQ(g.per_node, 2);
  const double core_f = 0.01, core_b = 0.025;  // seconds of one layer's core
  const CpTime ring = cp_layer_seconds(fast, g, s, core_f, core_b);
  const double hop = p2p_seconds(fast, true, s.rows * 2 * s.kv * s.head_size * 4);
  EXPECT_DOUBLE_EQ(ring.fwd_comm, hop);
  EXPECT_DOUBLE_EQ(ring.fwd_exposed, 0);     // behind the first block's compute
  EXPECT_DOUBLE_EQ(ring.bwd_comm, 2 * hop);  // a block and the dK/dV part to its owner
  EXPECT_DOUBLE_EQ(ring.bwd_exposed, hop);   // the last part's way to its owner
  for (CpComm c : {CpComm::AllGather, CpComm::Ulysses}) {
    s.comm = c;
    const CpTime t = cp_layer_seconds(fast, g, s, core_f, core_b);
    EXPECT_GT(t.fwd_comm, 0);
    EXPECT_DOUBLE_EQ(t.fwd_exposed, t.fwd_comm);
    EXPECT_DOUBLE_EQ(t.bwd_exposed, t.bwd_comm);
  }
  // Slower links: exposure grows monotonically; in the limit ring shows all but its compute.
  for (CpComm c : kComms) {
    s.comm = c;
    double last_f = 0, last_b = 0;
    for (double gbs : {1000.0, 100.0, 10.0, 1.0, 0.1, 0.01}) {
      const ClusterSpec cl = with_link(gbs);
      const CpTime t = cp_layer_seconds(cl, g, s, core_f, core_b);
      EXPECT_GE(t.fwd_exposed, last_f) << nn::to_string(c) << " " << gbs;
      EXPECT_GE(t.bwd_exposed, last_b) << nn::to_string(c) << " " << gbs;
      EXPECT_LE(t.fwd_exposed, t.fwd_comm);
      EXPECT_LE(t.bwd_exposed, t.bwd_comm);
      if (c == CpComm::Ring) {
        EXPECT_GE(t.fwd_exposed, t.fwd_comm - core_f / 2 - 1e-15);  // one block of compute hides
        if (gbs <= 0.01) {
          EXPECT_GT(t.fwd_exposed / t.fwd_comm, 0.99);
        }
      }
      last_f = t.fwd_exposed, last_b = t.bwd_exposed;
    }
  }
  // More cp ranks: more ring steps to hide behind, the same per-step transfers at fixed R.
  s.comm = CpComm::Ring;
  s.n = 4;
  const CpTime four = cp_layer_seconds(fast, Group{4, 4}, s, core_f, core_b);
  EXPECT_DOUBLE_EQ(four.fwd_exposed, 0);
  EXPECT_DOUBLE_EQ(four.bwd_exposed, hop);

  // End to end: on NVLink the ring's step shows only the dK/dV parts' last hops; allgather's
  // shows all of its exchanges; both run cp 2 near twice as fast as one rank.
  const PlanRequest r = long_context("tessera");
  const Prediction one = plan_layout(r, cp_layout(1, CpComm::Ring));
  const Prediction pr = plan_layout(r, cp_layout(2, CpComm::Ring));
  const Prediction pa = plan_layout(r, cp_layout(2, CpComm::AllGather));
  const RankTime& tr = pr.rank_time[0];
  const RankTime& ta = pa.rank_time[0];
  EXPECT_GT(tr.cp_comm, 0);
  EXPECT_LT(tr.cp_exposed, 0.5 * tr.cp_comm);
  EXPECT_DOUBLE_EQ(ta.cp_exposed, ta.cp_comm);
  EXPECT_LT(pr.step_seconds, 0.55 * one.step_seconds);
  EXPECT_LT(pa.step_seconds, 0.55 * one.step_seconds);
  EXPECT_GT(pr.cp_bytes, 0);
}

// A ranking tries context parallelism only when asked: by default every layout has cp = 1 (the
// rankings of before), with max_cp each cp up to it and every variant, with cp set only that cp.
TEST(ContextParallelPlan, RankingsTryCpOnlyWhenAsked) {
  PlanRequest r;
  r.model.layers = 4, r.model.hidden = 256, r.model.heads = 8, r.model.seq = 1024;
  r.model.vocab = 512;
  r.cluster = with_devices(load_cluster("dgx-h100"), 4);
  r.global_batch = 8;
  LayoutSpace space;
  space.recompute = nn::Recompute::None;
  space.micro_batch = 1;
  const Ranking plain = rank_layouts(r, 4, space, 4);
  for (const auto* list : {&plain.fitting, &plain.not_fitting})
    for (const Prediction& p : *list) EXPECT_EQ(p.layout.cp, 1) << p.layout.str();
  space.max_cp = 4;
  const Ranking with = rank_layouts(r, 4, space, 4);
  std::map<std::pair<int, CpComm>, int> seen;
  for (const Prediction& p : with.fitting) ++seen[{p.layout.cp, p.layout.cp_comm}];
  for (int cp : {2, 4})
    for (CpComm c : kComms) EXPECT_GT((seen[{cp, c}]), 0) << cp << " " << nn::to_string(c);
  EXPECT_GT(with.considered, plain.considered);
  space.max_cp = 1;
  space.cp = 2;
  space.cp_comm = CpComm::Ulysses;
  const Ranking fixed = rank_layouts(r, 4, space, 4);
  EXPECT_GT(fixed.considered, 0);
  for (const Prediction& p : fixed.fitting) {
    EXPECT_EQ(p.layout.cp, 2);
    EXPECT_EQ(p.layout.cp_comm, CpComm::Ulysses);
    EXPECT_EQ(p.layout.devices(), 4);
  }
}

}  // namespace
}  // namespace tessera::plan
