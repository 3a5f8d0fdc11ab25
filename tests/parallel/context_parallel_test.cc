// Context parallelism (--cp, docs/ARCHITECTURE.md decision 41): the token map (each rank's
// load-balanced positions, the tokens and targets sliced by them), the row map every token-wise
// kernel keys by (dropout masks, learned positions), and that every layout with context
// parallelism trains what one rank trains.
#include "tessera/nn/context_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/embedding.h"
#include "tessera/kernels/flash_attention.h"
#include "tessera/kernels/row_map.h"
#include "tessera/nn/context_parallel_attention.h"

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
