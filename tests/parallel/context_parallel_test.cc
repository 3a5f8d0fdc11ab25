// Context parallelism (--cp, docs/ARCHITECTURE.md decision 42): the token map (each rank's
// load-balanced positions, the tokens and targets sliced by them), the row map every token-wise
// kernel keys by (dropout masks, learned positions), and that every layout with context
// parallelism trains what one rank trains.
#include "tessera/nn/context_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "run_compare.h"
#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/embedding.h"
#include "tessera/kernels/flash_attention.h"
#include "tessera/kernels/row_map.h"
#include "tessera/nn/context_parallel_attention.h"
#include "tessera/nn/gpt.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "train_fixture.h"

namespace tessera::nn {
namespace {

// Rank r of n holds chunks r and 2n - 1 - r of 2n, in that order; together the ranks hold every
// position once.
TEST(ContextParallel, PositionsAreTheHeadAndTailChunks) {
  EXPECT_EQ(context_positions(16, 2, 0), (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(context_positions(16, 2, 1), (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(context_positions(12, 3, 1), (std::vector<int64_t>{2, 3, 8, 9}));
  EXPECT_EQ(context_positions(5, 1, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  for (int n : {2, 3, 4}) {
    const int64_t T = 24;
    std::vector<int64_t> all;
    for (int r = 0; r < n; ++r) {
      const std::vector<int64_t> p = context_positions(T, n, r);
      EXPECT_EQ(static_cast<int64_t>(p.size()), T / n);
      all.insert(all.end(), p.begin(), p.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(static_cast<size_t>(T));
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(all, want) << n;
  }
  EXPECT_THROW(context_positions(100, 4, 0), ShapeError);  // 8 does not divide 100
  EXPECT_THROW(context_positions(16, 2, 2), ShapeError);
}

// The tokens and targets of a cp rank are the sequences' entries at its positions.
TEST(ContextParallel, SequencesAreSlicedByPosition) {
  const int B = 2;
  const int64_t T = 8;
  std::vector<int32_t> in(static_cast<size_t>(B * T));
  std::iota(in.begin(), in.end(), 100);
  const std::vector<int64_t> pos = context_positions(T, 2, 1);  // 2, 3, 4, 5
  std::vector<int32_t> out(static_cast<size_t>(B * T / 2));
  slice_sequences(out.data(), in.data(), B, T, pos.data(), T / 2);
  EXPECT_EQ(out, (std::vector<int32_t>{102, 103, 104, 105, 110, 111, 112, 113}));
  Batch b;
  b.B = B, b.T = 4, b.first_sample = 6, b.seq_len = 8, b.positions = pos.data();
  const kernels::RowMap map = row_map(b);
  EXPECT_EQ(map.global_row(0), 6 * 8 + 2);
  EXPECT_EQ(map.global_row(5), 7 * 8 + 3);
  Batch whole;
  whole.B = 3, whole.T = 8, whole.first_sample = 2;
  EXPECT_EQ(row_map(whole).global_row(9), 3 * 8 + 1);  // first_sample * T + row, as before
}

// A cp rank's rows draw the single-device mask of its tokens, and so does a sequence-parallel
// slice of them (rows [first, first + rows) of the rank's micro-batch).
TEST(ContextParallel, DropoutRowMapDrawsTheSingleDeviceMask) {
  const int B = 3, C = 5;
  const int64_t T = 12, s0 = 4;
  const float p = 0.3f;
  const uint64_t seed = 7, stream = 11;
  std::vector<float> ones(static_cast<size_t>(B * T * C), 1.0f);
  std::vector<float> full(ones.size());
  std::vector<uint8_t> full_mask(ones.size());
  kernels::dropout_forward_rows(full.data(), full_mask.data(), ones.data(), B * T, C, p, seed,
                                stream, s0 * T);
  for (int n : {2, 3}) {
    for (int r = 0; r < n; ++r) {
      const std::vector<int64_t> pos = context_positions(T, n, r);
      const int64_t Tl = T / n;
      const kernels::RowMap map{s0, Tl, T, pos.data()};
      std::vector<float> out(static_cast<size_t>(B * Tl * C));
      std::vector<uint8_t> mask(out.size()), mask_only(out.size());
      kernels::dropout_forward_rows(out.data(), mask.data(), ones.data(), B * Tl, C, p, seed,
                                    stream, map, 0);
      kernels::dropout_mask_rows(mask_only.data(), B * Tl, C, p, seed, stream, map, 0);
      for (int b = 0; b < B; ++b)
        for (int64_t t = 0; t < Tl; ++t)
          for (int c = 0; c < C; ++c) {
            const size_t here = static_cast<size_t>((b * Tl + t) * C + c);
            const size_t there = static_cast<size_t>((b * T + pos[t]) * C + c);
            ASSERT_EQ(out[here], full[there]) << n << " " << r << " " << b << " " << t;
            ASSERT_EQ(mask[here], full_mask[there]);
            ASSERT_EQ(mask_only[here], full_mask[there]);
          }
      // Rows [3, 3 + 5) of the rank's micro-batch (a sequence-parallel slice).
      std::vector<float> slice(static_cast<size_t>(5 * C));
      kernels::dropout_forward_rows(slice.data(), nullptr, ones.data(), 5, C, p, seed, stream, map,
                                    3);
      for (int i = 0; i < 5 * C; ++i) ASSERT_EQ(slice[static_cast<size_t>(i)], out[3 * C + i]);
    }
  }
}

// Learned positions at a cp rank's global positions, forward (whole rows and a slice of them) and
// backward.
TEST(ContextParallel, LearnedPositionsFollowTheRowMap) {
  const int B = 2, C = 3, V = 5;
  const int64_t T = 8, Tl = 4;
  std::vector<float> wte(static_cast<size_t>(V * C)), wpe(static_cast<size_t>(T * C));
  std::iota(wte.begin(), wte.end(), 0.0f);
  std::iota(wpe.begin(), wpe.end(), 100.0f);
  const std::vector<int64_t> pos = context_positions(T, 2, 0);  // 0, 1, 6, 7
  const std::vector<int32_t> tokens{1, 2, 3, 4, 0, 1, 2, 3};
  std::vector<float> out(static_cast<size_t>(B * Tl * C));
  kernels::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, Tl, C,
                             pos.data());
  for (int b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t)
      for (int c = 0; c < C; ++c)
        EXPECT_EQ(out[static_cast<size_t>((b * Tl + t) * C + c)],
                  wte[static_cast<size_t>(tokens[b * Tl + t] * C + c)] +
                      wpe[static_cast<size_t>(pos[t] * C + c)]);
  std::vector<float> rows(static_cast<size_t>(3 * C), 0.0f);
  kernels::add_positions_rows(rows.data(), wpe.data(), kernels::RowMap{0, Tl, T, pos.data()}, 3, 3,
                              C);
  for (int i = 0; i < 3; ++i)  // rows 3, 4, 5: positions 7, 0, 1
    EXPECT_EQ(rows[static_cast<size_t>(i * C)], wpe[static_cast<size_t>(pos[(3 + i) % 4] * C)]);
  std::vector<float> dwpe(wpe.size(), 0.0f), dout(out.size(), 1.0f);
  kernels::embedding_backward(nullptr, dwpe.data(), dout.data(), tokens.data(), B, Tl, C,
                              pos.data());
  for (int64_t t = 0; t < T; ++t) {
    const bool mine = std::find(pos.begin(), pos.end(), t) != pos.end();
    EXPECT_EQ(dwpe[static_cast<size_t>(t * C)], mine ? 2.0f : 0.0f) << t;
  }
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = philox_uniform(seed, 5, i) * 2.0f - 1.0f;
  return v;
}

// The attention core split over n ranks (each variant) against the fused kernel over the whole
// sequences on one rank: every rank's output and q, k, v gradients are those of its rows, within
// fp32 rounding (the sums run in other orders), causal, dropout on, grouped-query heads.
void expect_core_matches_one_rank(CpComm comm, int n, int q_heads, int kv_heads) {
  const int B = 2, D = 8;
  const int64_t T = 24;
  const kernels::AttentionHeads heads{q_heads, kv_heads, D};
  const int64_t W = heads.row_width(), Qw = int64_t{q_heads} * D, R = B * T;
  const std::vector<float> qkv = random_floats(static_cast<size_t>(R * W), 1);
  const std::vector<float> datty = random_floats(static_cast<size_t>(R * Qw), 2);
  kernels::AttentionDropout drop{0.2f, 9, 4, /*first_sample=*/6, 0, q_heads, 0};
  // One rank: the whole sequences.
  kernels::FlashAttention f;
  f.B = B, f.Tq = f.Tk = static_cast<int>(T), f.heads = heads;
  f.q = qkv.data(), f.k = qkv.data() + Qw, f.v = qkv.data() + Qw + int64_t{kv_heads} * D;
  f.ldq = f.ldkv = W;
  f.drop = drop;
  std::vector<float> out(static_cast<size_t>(R * Qw)), lse(static_cast<size_t>(B * q_heads * T));
  kernels::flash_attention_forward(f, out.data(), Qw, lse.data());
  std::vector<float> delta(lse.size()), dqkv(qkv.size(), 0.0f);
  kernels::flash_attention_delta(delta.data(), out.data(), Qw, datty.data(), Qw, B,
                                 static_cast<int>(T), heads);
  kernels::flash_attention_backward(f, datty.data(), Qw, lse.data(), delta.data(), dqkv.data(), W,
                                    dqkv.data() + Qw, dqkv.data() + Qw + int64_t{kv_heads} * D, W);
  std::mutex mu;
  double worst_out = 0, worst_grad = 0;
  comm::run_inproc(n, [&](comm::Communicator& g) {
    Allocator alloc("cp rank", 0);
    CurrentAllocatorScope scope(alloc);
    const ContextSplit cp(g, comm);
    const std::vector<int64_t> pos = context_positions(T, n, g.rank());
    const int64_t Tl = T / n, Rl = B * Tl;
    std::vector<float> q_l(static_cast<size_t>(Rl * W)), dy_l(static_cast<size_t>(Rl * Qw));
    for (int b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t) {
        std::memcpy(&q_l[static_cast<size_t>((b * Tl + t) * W)],
                    &qkv[static_cast<size_t>((b * T + pos[t]) * W)], sizeof(float) * W);
        std::memcpy(&dy_l[static_cast<size_t>((b * Tl + t) * Qw)],
                    &datty[static_cast<size_t>((b * T + pos[t]) * Qw)], sizeof(float) * Qw);
      }
    ContextAttention a;
    a.cp = &cp, a.B = B, a.T = static_cast<int>(Tl), a.seq_len = T, a.positions = pos.data();
    a.heads = heads, a.head_offset = 0, a.n_head = q_heads, a.drop = drop, a.label = "test.";
    std::vector<float> out_l(static_cast<size_t>(Rl * Qw)),
        lse_l(static_cast<size_t>(B * q_heads * Tl));
    std::vector<float> dq_l(q_l.size());
    context_attention_forward(a, q_l.data(), out_l.data(), lse_l.data());
    context_attention_backward(a, q_l.data(), out_l.data(), lse_l.data(), dy_l.data(), dq_l.data());
    double wo = 0, wg = 0;
    for (int b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t) {
        for (int64_t c = 0; c < Qw; ++c)
          wo = std::max<double>(wo, std::abs(out_l[static_cast<size_t>((b * Tl + t) * Qw + c)] -
                                             out[static_cast<size_t>((b * T + pos[t]) * Qw + c)]));
        for (int64_t c = 0; c < W; ++c)
          wg = std::max<double>(wg, std::abs(dq_l[static_cast<size_t>((b * Tl + t) * W + c)] -
                                             dqkv[static_cast<size_t>((b * T + pos[t]) * W + c)]));
      }
    std::lock_guard<std::mutex> lock(mu);
    worst_out = std::max(worst_out, wo);
    worst_grad = std::max(worst_grad, wg);
  });
  EXPECT_LT(worst_out, 1e-5) << to_string(comm) << " cp " << n;
  EXPECT_LT(worst_grad, 1e-5) << to_string(comm) << " cp " << n;
}

TEST(ContextParallel, AttentionCoreOfEveryVariantIsTheOneRankCore) {
  for (CpComm comm : {CpComm::AllGather, CpComm::Ring, CpComm::Ulysses})
    for (int n : {2, 3, 4}) {
      if (comm == CpComm::Ulysses && n == 3) continue;  // 3 divides no head count here
      expect_core_matches_one_rank(comm, n, 4, 2);      // grouped-query (Ulysses n 4: replicated)
    }
  expect_core_matches_one_rank(CpComm::Ulysses, 3, 6, 3);  // 3 divides both
  expect_core_matches_one_rank(CpComm::Ring, 2, 2, 2);     // multi-head
}

// The ring's backward sends each held block's dK, dV straight to its owner, which adds them to its
// own part in step order: the same sums, in the same order, as a dK/dV accumulator travelling the
// ring (own part, then ranks r + 1, r + 2, ...), so the same bits; and at cp 2 its transient
// buffers are two blocks of K/V or dK/dV (and delta), where the travelling accumulators held five.
TEST(ContextParallel, RingBackwardSumsAsTheTravellingAccumulatorInTwoBlocks) {
  const int B = 2, D = 8, qh = 4, kvh = 2;
  const int64_t T = 24;
  const kernels::AttentionHeads heads{qh, kvh, D};
  const int64_t W = heads.row_width(), Qw = int64_t{qh} * D, KV2 = 2 * int64_t{kvh} * D;
  const kernels::AttentionDropout drop{0.2f, 9, 4, /*first_sample=*/6, 0, qh, 0};
  for (int n : {2, 3, 4}) {
    const int64_t Tl = T / n, Rl = B * Tl;
    struct Rank {
      std::vector<int64_t> pos;
      std::vector<float> qkv, dy, out, lse, dqkv;
      double bwd_peak = 0;
    };
    std::vector<Rank> ranks(static_cast<size_t>(n));
    comm::run_inproc(n, [&](comm::Communicator& g) {
      Allocator alloc("cp rank", 0);
      CurrentAllocatorScope scope(alloc);
      const ContextSplit cp(g, CpComm::Ring);
      Rank& me = ranks[static_cast<size_t>(g.rank())];
      me.pos = context_positions(T, n, g.rank());
      me.qkv = random_floats(static_cast<size_t>(Rl * W), 10 + g.rank());
      me.dy = random_floats(static_cast<size_t>(Rl * Qw), 20 + g.rank());
      me.out.resize(static_cast<size_t>(Rl * Qw));
      me.lse.resize(static_cast<size_t>(B * qh * Tl));
      me.dqkv.resize(me.qkv.size());
      ContextAttention a;
      a.cp = &cp, a.B = B, a.T = static_cast<int>(Tl), a.seq_len = T, a.positions = me.pos.data();
      a.heads = heads, a.head_offset = 0, a.n_head = qh, a.drop = drop, a.label = "test.";
      context_attention_forward(a, me.qkv.data(), me.out.data(), me.lse.data());
      alloc.reset_peaks();
      context_attention_backward(a, me.qkv.data(), me.out.data(), me.lse.data(), me.dy.data(),
                                 me.dqkv.data());
      me.bwd_peak = static_cast<double>(alloc.peak(MemCategory::Buffers));
    });
    // The travelling accumulator's arithmetic: rank j at step i holds rank (j - i)'s keys, adds
    // its queries' dQ over them to dq and its dK, dV of them (a zeroed part) to the accumulator.
    std::vector<std::vector<float>> want(static_cast<size_t>(n)), parts(static_cast<size_t>(n * n));
    for (int j = 0; j < n; ++j) {
      Rank& rj = ranks[static_cast<size_t>(j)];
      std::vector<float> delta(rj.lse.size());
      kernels::flash_attention_delta(delta.data(), rj.out.data(), Qw, rj.dy.data(), Qw, B,
                                     static_cast<int>(Tl), heads);
      want[static_cast<size_t>(j)].assign(rj.qkv.size(), 0.0f);
      for (int i = 0; i < n; ++i) {
        const int src = (j - i + n) % n;
        const Rank& rs = ranks[static_cast<size_t>(src)];
        kernels::FlashAttention f;
        f.B = B, f.Tq = f.Tk = static_cast<int>(Tl), f.heads = heads;
        f.q = rj.qkv.data(), f.ldq = W;
        f.k = rs.qkv.data() + Qw, f.v = f.k + KV2 / 2, f.ldkv = W;
        f.q_pos = rj.pos.data(), f.k_pos = rs.pos.data();
        f.drop = drop;
        f.drop.seq_len = T;
        std::vector<float>& part = parts[static_cast<size_t>(j * n + src)];
        part.assign(static_cast<size_t>(Rl * KV2), 0.0f);
        kernels::flash_attention_backward(f, rj.dy.data(), Qw, rj.lse.data(), delta.data(),
                                          want[static_cast<size_t>(j)].data(), W, part.data(),
                                          part.data() + KV2 / 2, KV2);
      }
    }
    for (int b = 0; b < n; ++b) {
      std::vector<float> acc = parts[static_cast<size_t>(b * n + b)];  // the owner's part first
      for (int i = 1; i < n; ++i) {
        const std::vector<float>& p = parts[static_cast<size_t>(((b + i) % n) * n + b)];
        for (size_t e = 0; e < acc.size(); ++e) acc[e] = acc[e] + p[e];
      }
      std::vector<float>& w = want[static_cast<size_t>(b)];
      for (int64_t r = 0; r < Rl; ++r)
        std::memcpy(&w[static_cast<size_t>(r * W + Qw)], &acc[static_cast<size_t>(r * KV2)],
                    sizeof(float) * KV2);
      const Rank& rb = ranks[static_cast<size_t>(b)];
      for (size_t e = 0; e < w.size(); ++e)
        ASSERT_EQ(rb.dqkv[e], w[e]) << "cp " << n << " rank " << b << " element " << e;
    }
    if (n == 2) {
      for (const Rank& r : ranks) {
        EXPECT_EQ(r.bwd_peak, 4.0 * (2 * Rl * KV2 + Rl * qh));  // two blocks and delta
      }
    }
  }
}

TEST(ContextParallel, UlyssesNamesItsHeadRule) {
  try {
    check_context_heads(CpComm::Ulysses, 3, kernels::AttentionHeads{4, 2, 8});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must divide the 4 query heads"), std::string::npos)
        << e.what();
  }
  check_context_heads(CpComm::Ulysses, 4, kernels::AttentionHeads{4, 2, 8});  // replicated kv
  check_context_heads(CpComm::AllGather, 3, kernels::AttentionHeads{4, 2, 8});
}

}  // namespace
}  // namespace tessera::nn

// ---- Every layout with context parallelism trains what one rank trains ----------------------

namespace tessera::train {
namespace {

using testing::expect_same_run;
using testing::Reference;
using testing::run_reference;
using testing::temp_dir;

enum class Family { Gpt2, Llama, Gpt2Moe, LlamaMoe };

// 2 blocks of 4 heads (Llama: over 2 key/value heads, grouped-query) of 8, sequences of 24 tokens
// (2 x cp divides 24 for cp 2, 3 and 4), dropout on every site, clipping, several buckets; the
// mixtures with a per-sequence capacity that drops (so the cp ranks must decide it together) and
// auxiliary losses.
TrainConfig cp_config(const std::filesystem::path& dir, Family f) {
  TrainConfig c = testing::tiny_config(dir);
  c.heads = 4;
  c.seq = 24;
  c.batch = 4;
  c.steps = 5;
  c.warmup = 2;
  c.lr = 5e-3f;
  c.dropout = 0.1f;
  c.grad_clip = 0.5f;
  c.bucket_mb = 0.01;
  c.val_fraction = 0;
  if (f == Family::Llama || f == Family::LlamaMoe) {
    c.arch = nn::Arch::Llama;
    c.kv_heads = 2;
    c.ffn_dim = 48;
    c.tie_embeddings = false;
    c.qkv_bias = true;
  }
  if (f == Family::Gpt2Moe || f == Family::LlamaMoe) {
    c.moe_experts = 4;
    c.moe_top_k = 2;
    c.moe_capacity_factor = 0.75f;
    c.moe_aux_loss = 0.05f;
    c.moe_z_loss = 0.01f;
    c.micro_batch = 1;
  }
  return c;
}

const char* family_name(Family f) {
  switch (f) {
    case Family::Gpt2:
      return "gpt2";
    case Family::Llama:
      return "llama";
    case Family::Gpt2Moe:
      return "gpt2_moe";
    case Family::LlamaMoe:
      return "llama_moe";
  }
  return "?";
}

// One rank's run of a family, and where its metrics are.
struct OneRank {
  Reference run;
  std::filesystem::path metrics;
};
const OneRank& one_rank(Family f) {
  static std::map<Family, OneRank> refs;
  auto it = refs.find(f);
  if (it == refs.end()) {
    auto dir = temp_dir(std::string("cp_reference_") + family_name(f));
    it = refs.emplace(f, OneRank{run_reference("run", cp_config(dir, f), dir), dir / "run.jsonl"})
             .first;
  }
  return it->second;
}

// The MoE statistics of each step (metrics): they must count every cp rank's tokens once.
std::vector<std::array<double, 3>> moe_stats(const std::filesystem::path& metrics) {
  std::vector<std::array<double, 3>> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("moe_aux_loss"))
      out.push_back({j["moe_aux_loss"].get<double>(), j["moe_z_loss"].get<double>(),
                     j["moe_dropped_fraction"].get<double>()});
  }
  return out;
}

struct CpLayout {
  Family family = Family::Gpt2;
  int cp = 2;
  nn::CpComm comm = nn::CpComm::AllGather;
  int dp = 1, zero = 0, tp = 1, pp = 1, ep = 1;
  bool sp = false;
  std::string schedule = "1f1b";
  std::string recompute = "none";
};

std::string layout_name(const CpLayout& l) {
  std::string s = std::string(family_name(l.family)) + "_cp" + std::to_string(l.cp) + "_" +
                  nn::to_string(l.comm);
  if (l.dp > 1) s += "_dp" + std::to_string(l.dp) + "_zero" + std::to_string(l.zero);
  if (l.tp > 1) s += "_tp" + std::to_string(l.tp) + (l.sp ? "sp" : "");
  if (l.pp > 1) s += "_pp" + std::to_string(l.pp) + "_" + l.schedule;
  if (l.ep > 1) s += "_ep" + std::to_string(l.ep);
  if (l.recompute != "none") s += "_" + l.recompute;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

void PrintTo(const CpLayout& l, std::ostream* os) {
  *os << layout_name(l);
}

class ContextParallelLayouts : public ::testing::TestWithParam<CpLayout> {};

TEST_P(ContextParallelLayouts, SameLossesAndWeightsAsOneRank) {
  const CpLayout l = GetParam();
  const OneRank& one = one_rank(l.family);
  const Reference& ref = one.run;
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.2) << "the reference run should learn";
  auto dir = temp_dir("cp_" + layout_name(l));
  TrainConfig c = cp_config(dir, l.family);
  c.cp = l.cp;
  c.cp_comm = l.comm;
  c.dp = l.dp, c.zero = l.zero, c.tp = l.tp, c.sp = l.sp, c.pp = l.pp, c.ep = l.ep;
  c.recompute = nn::parse_recompute(l.recompute);
  if (l.pp > 1) {
    c.schedule = parallel::parse_schedule(l.schedule);
    c.micro_batch = 1;  // the reference's micro-batches (MoE) or a pipeline of 4
  }
  const Reference got = run_reference("run", c, dir);
  // Losses and gradient norms within 1e-5 at every step; weights within 1e-5, but where another
  // axis splits GEMMs or micro-batches (tp, pp's micro-batches of 1 against the reference's 4,
  // the experts' row blocks): AdamW's first steps turn rounding-level differences of near-zero
  // gradients into whole steps there (run_compare.h, moe_training_test.cc), 5e-5.
  const bool other_axis = l.tp > 1 || l.pp > 1;
  expect_same_run(ref, got, other_axis ? testing::kTensorParallelWeightRel : 1e-5, 5e-5);
  // A mixture's statistics (the balance and z losses, the dropped share: per-sequence capacity
  // decided over the whole sequence) are one rank's.
  if (l.family == Family::Gpt2Moe || l.family == Family::LlamaMoe) {
    const auto want = moe_stats(one.metrics), have = moe_stats(dir / "run.jsonl");
    ASSERT_EQ(have.size(), want.size());
    ASSERT_FALSE(want.empty());
    double dropped = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      for (int k = 0; k < 3; ++k)
        EXPECT_NEAR(have[i][k], want[i][k], 1e-5 * std::abs(want[i][k]) + 1e-12)
            << "MoE statistic " << k << ", step " << i + 1;
      dropped += want[i][2];
    }
    EXPECT_GT(dropped, 0.0) << "the capacity should drop assignments";
  }
}

std::vector<CpLayout> cp_layouts() {
  using nn::CpComm;
  std::vector<CpLayout> v;
  auto add = [&](Family f, int cp, CpComm comm) {
    CpLayout l;
    l.family = f, l.cp = cp, l.comm = comm;
    v.push_back(l);
    return &v.back();
  };
  // Each variant at cp 2 and 4 (3 where the heads allow: not Ulysses), GPT-2 and Llama (GQA;
  // Ulysses at cp 4 replicates each key/value head over two ranks).
  for (Family f : {Family::Gpt2, Family::Llama})
    for (CpComm comm : {CpComm::AllGather, CpComm::Ring, CpComm::Ulysses})
      for (int cp : {2, 3, 4})
        if (!(comm == CpComm::Ulysses && cp == 3)) add(f, cp, comm);
  // With the other axes.
  add(Family::Gpt2, 2, CpComm::AllGather)->dp = 2, v.back().zero = 1;
  add(Family::Llama, 2, CpComm::Ring)->dp = 2, v.back().zero = 3;
  add(Family::Gpt2, 2, CpComm::Ulysses)->tp = 2, v.back().sp = true;
  add(Family::Llama, 2, CpComm::AllGather)->tp = 2, v.back().sp = true;
  add(Family::Gpt2, 2, CpComm::Ring)->pp = 2;
  add(Family::Llama, 2, CpComm::Ulysses)->pp = 2, v.back().schedule = "zb-h1";
  add(Family::Gpt2, 2, CpComm::AllGather)->recompute = "full";
  add(Family::Llama, 2, CpComm::Ring)->recompute = "selective";
  // The ring keeps its blocks in the block workspace's d_fc (two at cp 2 for GPT-2): dead during
  // the attention core under recomputation and zero-bubble split backwards too.
  add(Family::Gpt2, 2, CpComm::Ring)->recompute = "full";
  add(Family::Gpt2, 2, CpComm::Ring)->pp = 2, v.back().schedule = "zb-h1";
  // Mixtures of experts: alone, and with expert parallelism over dp 2.
  add(Family::Gpt2Moe, 2, CpComm::AllGather);
  add(Family::LlamaMoe, 2, CpComm::Ring)->dp = 2, v.back().ep = 2, v.back().zero = 1;
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelLayouts, ::testing::ValuesIn(cp_layouts()),
                         [](const auto& info) { return layout_name(info.param); });

// Checkpoints stay layout-free: saved at cp 2 halfway and resumed at cp 1, saved at cp 1 and
// resumed at cp 4 with ring and dp 2 (ZeRO-1), both continue the uninterrupted run.
TEST(ContextParallelCheckpoint, ResumesUnderAnotherContextLayout) {
  auto dir = temp_dir("cp_resume");
  struct Leg {
    int cp, dp, zero;
    nn::CpComm comm;
  };
  for (const auto& [from, to] :
       {std::pair{Leg{2, 1, 0, nn::CpComm::AllGather}, Leg{1, 1, 0, nn::CpComm::AllGather}},
        std::pair{Leg{1, 1, 0, nn::CpComm::AllGather}, Leg{4, 2, 1, nn::CpComm::Ring}}}) {
    SCOPED_TRACE("cp " + std::to_string(from.cp) + " -> cp " + std::to_string(to.cp));
    // (No q/k/v biases: a Llama config.json says attention_bias for them, which reloads as q, k,
    // v and o biases -- a resume of such a model fails before context parallelism matters.)
    TrainConfig c = cp_config(dir, Family::Llama);
    c.qkv_bias = false;
    c.steps = 6;
    c.cp = from.cp, c.dp = from.dp, c.zero = from.zero, c.cp_comm = from.comm;
    c.save = (dir / ("from_cp" + std::to_string(from.cp))).string();
    c.save_every = 3;
    const TrainResult whole = run_training(c, nullptr);
    TrainConfig r = cp_config(dir, Family::Llama);
    r.qkv_bias = false;
    r.steps = 6;
    r.cp = to.cp, r.dp = to.dp, r.zero = to.zero, r.cp_comm = to.comm;
    r.resume = (std::filesystem::path(c.save) / "step-00000003").string();
    testing::expect_resumed(whole, run_training(r, nullptr), 3);
  }
}

// Validation runs split like training and its sums meet over the cp group; the end-of-run sample
// runs whole on every rank: both are one rank's.
TEST(ContextParallel, ValidationAndSampleAreOneRanks) {
  auto dir = temp_dir("cp_validation");
  TrainConfig c = cp_config(dir, Family::Gpt2);
  c.val_fraction = 0.1;
  c.eval_every = 2;
  c.eval_batches = 2;
  c.sample_tokens = 12;
  c.prompt = "The ";
  const TrainResult one = run_training(c, nullptr);
  c.cp = 2;
  c.cp_comm = nn::CpComm::Ring;
  const TrainResult two = run_training(c, nullptr);
  ASSERT_GT(one.last_val_loss, 0.0);
  EXPECT_NEAR(two.last_val_loss, one.last_val_loss, 1e-5 * one.last_val_loss);
  EXPECT_FALSE(one.sample.empty());
  EXPECT_EQ(two.sample, one.sample);
}

// A context-parallel rank's activations are its share of each sequence: a record (and the
// workspace) of a model built over a cp group of n holds block_size / n rows per sequence.
TEST(ContextParallel, RecordsHoldARanksShareOfEachSequence) {
  nn::GPTConfig m;
  m.n_layer = 2, m.n_embd = 32, m.n_head = 4, m.block_size = 64, m.vocab_size = 100;
  m.dropout = 0.1f;
  auto record_bytes = [&](int cp) {
    Allocator alloc("cp", 0, Backing::AddressSpaceOnly);
    const std::unique_ptr<comm::Communicator> one = comm::one_rank();
    const std::unique_ptr<comm::Communicator> group = comm::placeholder_group(cp, 0);
    nn::GPT model(m, 2, alloc, nn::GPTLayout{}, *one, *one, *group);
    EXPECT_EQ(model.rows_per_sequence(), 64 / cp);
    const size_t before = alloc.in_use();
    const std::unique_ptr<nn::StageRecord> rec = model.make_record();
    return alloc.in_use() - before;
  };
  const double one = static_cast<double>(record_bytes(1));
  EXPECT_NEAR(static_cast<double>(record_bytes(2)) / one, 0.5, 0.01);
  EXPECT_NEAR(static_cast<double>(record_bytes(4)) / one, 0.25, 0.01);
}

// What cannot run says what to change.
TEST(ContextParallel, BadCombinationsAreErrors) {
  auto dir = temp_dir("cp_errors");
  TrainConfig c = cp_config(dir, Family::Gpt2);
  c.seq = 100;
  c.cp = 4;
  EXPECT_NE(testing::config_error_of(c).find("--seq 100 is not divisible by 2 x --cp 4 = 8"),
            std::string::npos)
      << testing::config_error_of(c);
  c = cp_config(dir, Family::Llama);  // 4 query heads over 2 key/value heads
  c.cp = 3;
  c.cp_comm = nn::CpComm::Ulysses;
  EXPECT_NE(testing::config_error_of(c).find(
                "--cp-comm ulysses splits each rank's attention heads over the --cp ranks: --cp 3 "
                "must divide the 4 query heads"),
            std::string::npos)
      << testing::config_error_of(c);
  c.tp = 2;  // 2 query heads, 1 key/value head per tensor-parallel rank: cp 4 divides neither
  c.cp = 4;
  c.seq = 24;
  EXPECT_NE(testing::config_error_of(c).find("--cp 4 must divide the 2 query heads"),
            std::string::npos)
      << testing::config_error_of(c);
}

}  // namespace
}  // namespace tessera::train
