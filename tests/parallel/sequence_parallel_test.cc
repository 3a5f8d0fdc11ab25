// Sequence parallelism (Korthikanti et al. 2022) against one device.
//
// Layer level: the rows a rank holds (token_range), the sequence-parallel pair (all-gather and
// reduce-scatter, each the other's adjoint), the dropout masks of a rank's rows against the
// single-device mask, and each module on t thread ranks with TensorSplit::sequence against the
// unsplit module: a rank's output and input gradient are its rows of one device's, every gradient
// shard equals its slice of the full gradient (the LayerNorms' once summed over the group, the
// only partial ones), and the record's LayerNorm / dropout / residual tensors hold only its rows.
// Sequence lengths that t does not divide are included (uneven slices, an empty one).
//
// Training level: tp x sp x dp x ZeRO layouts, recomputation, a pipeline, resume across layouts,
// validation and sampling, and the configuration errors, against one rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "run_compare.h"
#include "tessera/core/error.h"
#include "tessera/kernels/dropout.h"
#include "tessera/nn/block.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/gelu_mlp.h"
#include "tessera/nn/gpt.h"
#include "tessera/nn/head.h"
#include "tessera/nn/tensor_parallel.h"
#include "tessera/train/trainer.h"
#include "tp_layer_fixture.h"
#include "tp_train_fixture.h"
#include "train_fixture.h"

namespace tessera::nn {
namespace {

TEST(TokenRange, ContiguousCeilSlicesPaddedForCollectives) {
  comm::run_inproc(4, [](comm::Communicator& c) {
    const TensorSplit sp{c, true};
    const TokenRange r = token_range(sp, 10);  // ceil(10 / 4) = 3: [0,3) [3,6) [6,9) [9,10)
    EXPECT_EQ(r.per, 3);
    EXPECT_EQ(r.padded(), 12);
    EXPECT_EQ(r.begin, 3 * c.rank());
    EXPECT_EQ(r.end, std::min(10, 3 * c.rank() + 3));
    EXPECT_EQ(r.place(), 3 * c.rank());
    const TokenRange e = token_range(sp, 5);  // 2, 2, 1, 0 rows: the last slice is empty
    EXPECT_EQ(e.size(), std::vector<int64_t>({2, 2, 1, 0})[static_cast<size_t>(c.rank())]);
    EXPECT_EQ(e.place(), 2 * c.rank());
    const TokenRange off = token_range(TensorSplit{c, false}, 10);  // tensor parallelism alone
    EXPECT_EQ(off.begin, 0);
    EXPECT_EQ(off.end, 10);
    EXPECT_EQ(off.padded(), 10);
  });
  const auto one = comm::one_rank();
  EXPECT_EQ(token_range(TensorSplit{*one, true}, 7).size(), 7);  // one rank: all rows
}

// gather_to_tp assembles the rows of every rank; reduce_scatter_from_tp gives each rank its rows
// of the sum; each one's backward is the other collective, and the two are adjoint:
// sum_q <gather(x), y_q> = sum_r <x_r, gather_backward(y)_r> for any slices x and gradients y.
TEST(SequenceParallelPair, GatherAndReduceScatterAreExactAndAdjoint) {
  const int64_t W = 5;
  for (int t : {2, 3, 4}) {
    for (int64_t n : {12, 7, 5}) {
      SCOPED_TRACE("t " + std::to_string(t) + " n " + std::to_string(n));
      auto value = [](int q, int64_t i) { return static_cast<float>((i * 7 + q * 3) % 11) - 5; };
      std::vector<double> lhs(static_cast<size_t>(t)), rhs(static_cast<size_t>(t));
      comm::run_inproc(t, [&](comm::Communicator& c) {
        const TensorSplit s{c, true};
        const TokenRange rows = token_range(s, n);
        const int q = c.rank();
        // x: this rank's rows of the activation value(0, .); y: a per-rank full gradient.
        std::vector<float> x(static_cast<size_t>(rows.per * W), NAN), full(rows.padded() * W);
        for (int64_t i = 0; i < rows.size() * W; ++i) x[i] = value(0, rows.begin * W + i);
        gather_to_tp(s, x.data(), full.data(), rows, W);
        for (int64_t i = 0; i < n * W; ++i) ASSERT_EQ(full[i], value(0, i)) << "gathered " << i;
        std::vector<float> y(full.size(), 0.0f), back(x.size());
        for (int64_t i = 0; i < n * W; ++i) y[i] = value(q + 1, i);
        gather_to_tp_backward(s, y.data(), back.data(), rows, W);
        for (int64_t i = 0; i < rows.size() * W; ++i) {
          float sum = 0;
          for (int r = 0; r < t; ++r) sum += value(r + 1, rows.begin * W + i);
          ASSERT_EQ(back[i], sum) << "reduce-scattered " << i;
        }
        double l = 0, r = 0;
        for (int64_t i = 0; i < n * W; ++i) l += static_cast<double>(full[i]) * y[i];
        for (int64_t i = 0; i < rows.size() * W; ++i) r += static_cast<double>(x[i]) * back[i];
        lhs[static_cast<size_t>(q)] = l, rhs[static_cast<size_t>(q)] = r;
        // reduce_scatter_from_tp is the same reduce-scatter (in place here), its backward the
        // same all-gather.
        std::vector<float> partial = y;
        float* mine =
            reduce_scatter_from_tp(s, partial.data(), partial.data() + rows.place() * W, rows, W);
        for (int64_t i = 0; i < rows.size() * W; ++i) ASSERT_EQ(mine[i], back[i]);
        std::vector<float> dfull(full.size());
        reduce_scatter_from_tp_backward(s, x.data(), dfull.data(), rows, W);
        for (int64_t i = 0; i < n * W; ++i) ASSERT_EQ(dfull[i], full[i]);
      });
      double l = 0, r = 0;
      for (int q = 0; q < t; ++q)
        l += lhs[static_cast<size_t>(q)], r += rhs[static_cast<size_t>(q)];
      EXPECT_NEAR(l, r, 1e-9 * std::abs(l));
    }
  }
}

// A rank holding rows [a, b) of the tokens draws exactly the single-device mask's elements.
TEST(SequenceParallelDropout, RowsDrawTheSingleDeviceMask) {
  const int B = 3, T = 7, C = 6;
  const int64_t first_sample = 4;
  std::vector<float> in(static_cast<size_t>(B) * T * C, 1.0f), full(in.size());
  std::vector<uint8_t> mask(in.size());
  kernels::dropout_forward_btc(full.data(), mask.data(), in.data(), B, T, C, 0.3f, 99, 5,
                               first_sample);
  for (int t : {2, 4}) {
    comm::run_inproc(t, [&](comm::Communicator& c) {
      const TokenRange rows = token_range(TensorSplit{c, true}, B * T);
      std::vector<float> out(static_cast<size_t>(rows.size()) * C);
      std::vector<uint8_t> m(out.size()), redrawn(out.size());
      kernels::dropout_forward_rows(out.data(), m.data(), in.data(), rows.size(), C, 0.3f, 99, 5,
                                    first_sample * T + rows.begin);
      kernels::dropout_mask_rows(redrawn.data(), rows.size(), C, 0.3f, 99, 5,
                                 first_sample * T + rows.begin);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], full[rows.begin * C + i]) << "rank " << c.rank() << " element " << i;
        ASSERT_EQ(m[i], mask[rows.begin * C + i]);
        ASSERT_EQ(redrawn[i], m[i]);
      }
    });
  }
}

// ---- modules under sequence parallelism ----------------------------------------------------

// Rows [r.begin, r.end) of a [n, width] array, in a buffer of r.per rows (the rest NaN).
std::vector<float> rows_of(const std::vector<float>& a, const TokenRange& r, int64_t width) {
  std::vector<float> out(static_cast<size_t>(r.per * width), NAN);
  std::copy(a.begin() + r.begin * width, a.begin() + r.end * width, out.begin());
  return out;
}

// What a sequence-parallel rank produced: its rows of the output and input gradient, its
// gradients, and which parameters it marked as partial sums.
struct SpOut {
  RankOut o;
  TokenRange rows;
  std::set<std::string> partial;
};

std::set<std::string> marked_partial(const ParameterSet& ps) {
  std::set<std::string> s;
  for (const ParamInfo& p : ps.infos())
    if (p.reduction.over_tensor_parallel) s.insert(p.name);
  return s;
}

template <typename Body>
std::vector<SpOut> on_sp_ranks(int t, Body body) {
  std::vector<SpOut> outs(static_cast<size_t>(t));
  comm::run_inproc(t, [&](comm::Communicator& c) {
    Allocator alloc("sp rank " + std::to_string(c.rank()));
    CurrentAllocatorScope scope(alloc);
    outs[static_cast<size_t>(c.rank())] = body(TensorSplit{c, true}, alloc);
  });
  return outs;
}

// The same body on one rank without a group (the single-device module).
template <typename Body>
SpOut one_device(Body body) {
  SpOut out;
  comm::run_inproc(1, [&](comm::Communicator&) {
    Allocator alloc("one device");
    CurrentAllocatorScope scope(alloc);
    const auto one = comm::one_rank();
    out = body(TensorSplit{*one}, alloc);
  });
  return out;
}

// Each rank's rows equal one device's; the partial gradients (exactly `partial`) summed over the
// ranks, and every other gradient shard as it is, equal one device's gradients.
void expect_sp_equivalent(const RankOut& one, std::vector<SpOut> sp, int64_t width,
                          const std::set<std::string>& partial, double rel, bool rows_out = true) {
  std::vector<Globals> grads, values;
  for (size_t r = 0; r < sp.size(); ++r) {
    const std::string rank = " (sp rank " + std::to_string(r) + ")";
    const SpOut& s = sp[r];
    EXPECT_EQ(s.partial, partial) << rank;
    const int64_t mine = s.rows.size() * width;
    auto first = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin(), v.begin() + mine);
    };
    if (rows_out) {
      expect_near_all(first(rows_of(one.out, s.rows, width)), first(s.o.out), rel, "output" + rank);
      expect_near_all(first(rows_of(one.dx, s.rows, width)), first(s.o.dx), rel,
                      "input gradient" + rank);
    }
    EXPECT_NEAR(s.o.loss, one.loss, rel * std::abs(one.loss) + 1e-12) << rank;
    values.push_back(s.o.values);
    grads.push_back(s.o.grads);
  }
  for (const std::string& name : partial) {  // the engine's sum over the group
    std::vector<float> sum(grads[0].at(name).size(), 0.0f);
    for (const Globals& g : grads)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += g.at(name)[i];
    for (Globals& g : grads) g[name] = sum;
  }
  expect_shards_match(one.values, values, 0.0, "value");
  expect_shards_match(one.grads, grads, rel, "gradient");
}

struct LayerCase {
  int t, T;
};
std::string layer_case_name(const LayerCase& c) {
  return "tp" + std::to_string(c.t) + "_T" + std::to_string(c.T);
}

class SequenceParallelLayers : public ::testing::TestWithParam<LayerCase> {};

TEST_P(SequenceParallelLayers, EmbeddingEqualsOneDevice) {
  const LayerCase k = GetParam();
  const GPTConfig cfg = config(12, 24, 23, 0.1f);  // 23 rows: unequal vocabulary shards too
  const Data d = make_data(cfg, 1, k.T);
  const int64_t C = cfg.n_embd, n = static_cast<int64_t>(d.B) * d.T;
  auto run = [&](TensorSplit split, Allocator& alloc) {
    ParameterSet ps;
    Embedding e(ps, cfg, split);
    ps.materialize(alloc);
    ps.initialize(42);
    Embedding::Record rec = e.make_record(d.B, alloc);
    const TokenRange rows = token_range(split, n);
    std::vector<float> scratch(
        static_cast<size_t>(token_range(split, d.B * cfg.block_size).padded() * C));
    SpOut s{RankOut{}, rows, {}};
    s.o.out.resize(static_cast<size_t>(rows.per * C));
    e.forward(kCtx, d.batch(), s.o.out.data(), rec, scratch.data());
    std::vector<float> dy = rows_of(d.dy, rows, C);
    e.backward(rec, dy.data(), scratch.data());
    if (split.sequence_parallel()) {
      EXPECT_EQ(rec.mask.numel(), token_range(split, d.B * cfg.block_size).per * C);
    }
    s.o.grads = expand(ps, true);
    s.o.values = expand(ps, false);
    s.partial = marked_partial(ps);
    return s;
  };
  const std::vector<SpOut> one = {one_device(run)};
  const auto sp = on_sp_ranks(k.t, run);
  // The lookup is exact (one rank's row value plus zeros), and so are the rank's rows.
  for (const SpOut& s : sp)
    for (int64_t i = 0; i < s.rows.size() * C; ++i)
      ASSERT_EQ(s.o.out[i], one[0].o.out[s.rows.begin * C + i]);
  // wpe's and wte's gradients come from the all-gathered gradient: complete, nothing partial.
  expect_sp_equivalent(one[0].o, sp, C, {}, 1e-6, false);
}

TEST_P(SequenceParallelLayers, HeadEqualsOneDeviceFromItsRows) {
  const LayerCase k = GetParam();
  const GPTConfig cfg = config(12, 24, 23, 0.1f);
  const Data d = make_data(cfg, 2, k.T);
  const int64_t C = cfg.n_embd, n = static_cast<int64_t>(d.B) * d.T;
  auto run = [&](TensorSplit split, Allocator& alloc) {
    ParameterSet ps;
    Head h(ps, cfg, -1, split);
    ps.materialize(alloc);
    ps.initialize(42);
    Head::Record rec = h.make_record(d.B, alloc);
    const TokenRange rows = token_range(split, n);
    std::vector<float> x = rows_of(d.x, rows, C);
    SpOut s{RankOut{}, rows, {}};
    s.o.loss = h.forward(kCtx, d.batch(), x.data(), rec);
    s.o.dx.resize(static_cast<size_t>(rows.per * C));
    std::vector<float> scratch(
        static_cast<size_t>(token_range(split, d.B * cfg.block_size).padded() * C));
    h.backward(rec, s.o.dx.data(), scratch.data());
    s.o.out = s.o.dx;  // (the logits are compared through the loss and the gradients)
    s.o.grads = expand(ps, true);
    s.o.values = expand(ps, false);
    s.partial = marked_partial(ps);
    return s;
  };
  const std::vector<SpOut> one = {one_device(run)};
  expect_sp_equivalent(one[0].o, on_sp_ranks(k.t, run), C, {"ln_f.bias", "ln_f.weight"}, 1e-5);
}

const std::set<std::string> kBlockPartial = {"h.1.ln_1.bias", "h.1.ln_1.weight", "h.1.ln_2.bias",
                                             "h.1.ln_2.weight"};

// body(recompute, defer): the block on this rank's rows, forward then backward (defer: the
// zero-bubble split, BI then W).
SpOut run_block(const GPTConfig& cfg, const Data& d, Recompute rc, bool defer, TensorSplit split,
                Allocator& alloc) {
  const int64_t C = cfg.n_embd, n = static_cast<int64_t>(d.B) * d.T;
  ParameterSet ps;
  Block blk(ps, cfg, 1, split, ExpertSplit{split.group}, rc);
  ps.materialize(alloc);
  ps.initialize(42);
  Block::Record rec = blk.make_record(d.B, alloc);
  Block::Workspace ws = blk.make_workspace(d.B, alloc);
  const TokenRange rows = token_range(split, n);
  std::vector<float> x = rows_of(d.x, rows, C);
  SpOut s{RankOut{}, rows, {}};
  s.o.out.resize(x.size());
  blk.forward(kCtx, d.batch(), x.data(), s.o.out.data(), rec, ws);
  s.o.dx = rows_of(d.dy, rows, C);
  blk.backward(rec, s.o.dx.data(), ws, defer);
  if (defer) blk.backward_weight(rec);
  s.o.grads = expand(ps, true);
  s.o.values = expand(ps, false);
  s.partial = marked_partial(ps);
  return s;
}

TEST_P(SequenceParallelLayers, BlockEqualsOneDeviceInEveryRecomputeMode) {
  const LayerCase k = GetParam();
  const GPTConfig cfg = config(12, 24, 23, 0.1f);
  const Data d = make_data(cfg, 3, k.T);
  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    for (bool defer : {false, true}) {
      SCOPED_TRACE(std::string(to_string(rc)) + (defer ? " split BI/W" : ""));
      auto run = [&](TensorSplit s, Allocator& a) { return run_block(cfg, d, rc, defer, s, a); };
      const std::vector<SpOut> one = {one_device(run)};
      const auto sp = on_sp_ranks(
          k.t, [&](TensorSplit s, Allocator& a) { return run_block(cfg, d, rc, defer, s, a); });
      expect_sp_equivalent(one[0].o, sp, cfg.n_embd, kBlockPartial, 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, SequenceParallelLayers,
                         ::testing::Values(LayerCase{2, 8}, LayerCase{3, 8}, LayerCase{4, 8},
                                           LayerCase{2, 7}, LayerCase{4, 7}),
                         [](const auto& info) { return layer_case_name(info.param); });

// The point of sequence parallelism: the record's LayerNorm, dropout and residual tensors hold
// ceil(B*T / t) rows, so a block's activations are those of tensor parallelism divided by t
// (fp32 formula per block, b s tokens of h features, a heads: (b s / t) (12 h + 16) + 2 (b s / t) h
// [masks] + (b s) 48 h / t + 4 a b s / t [the fused attention's log-sum-exp of this rank's heads]).
TEST(SequenceParallelMemory, BlockRecordHoldsOnlyTheRanksRows) {
  const GPTConfig cfg = config(12, 24, 23, 0.1f);
  const int B = 3;
  const int64_t C = cfg.n_embd, s = cfg.block_size, bs = B * s, a = cfg.n_head;
  auto record_bytes = [&](int t, bool sequence) {
    std::vector<double> bytes(static_cast<size_t>(t));
    comm::run_inproc(t, [&](comm::Communicator& c) {
      Allocator alloc("probe");
      ParameterSet ps;
      Block blk(ps, cfg, 0, TensorSplit{c, sequence}, ExpertSplit{c}, Recompute::None);
      ps.materialize(alloc);
      const size_t before = alloc.in_use(MemCategory::Activations);
      Block::Record rec = blk.make_record(B, alloc);
      bytes[static_cast<size_t>(c.rank())] =
          static_cast<double>(alloc.in_use(MemCategory::Activations) - before);
      if (sequence) {
        EXPECT_EQ(rec.attention->ln1.numel(), bs / t * C);
        EXPECT_EQ(rec.x_attn.numel(), bs / t * C);
        EXPECT_EQ(static_cast<const GeluMlpRecord&>(*rec.mlp).mask.numel(), bs / t * C);
        EXPECT_EQ(rec.attention->qkv.numel(),
                  bs * 3 * C / t);  // the tensor-parallel region: every token
      }
    });
    return bytes[0];
  };
  for (int t : {2, 4}) {
    const double rows_part = bs / t * (4.0 * (3 * C + 4) + 2.0 * C);
    const double tp_part = bs * 4.0 * 12 * C / t + bs * 4.0 * a / t;
    EXPECT_EQ(record_bytes(t, true), rows_part + tp_part) << "t " << t;
    EXPECT_EQ(record_bytes(t, false), t * rows_part + tp_part) << "t " << t;
  }
}

// The whole model: loss and every gradient shard, dropout on; B*T = 3 with t = 4 leaves the last
// rank an empty slice of the residual stream (it still takes part in every collective).
TEST(SequenceParallelModel, GPTEqualsOneDeviceIncludingAnEmptySlice) {
  const GPTConfig cfg = config(12, 24, 23, 0.1f);
  for (int T : {8, 1}) {
    const Data d = make_data(cfg, 4, T);  // T = 1: 3 rows over 4 ranks, 1, 1, 1, 0
    for (int t : {2, 4}) {
      SCOPED_TRACE("T " + std::to_string(T) + " tp " + std::to_string(t));
      auto run = [&](TensorSplit split, Allocator& alloc) {
        GPTLayout layout;
        layout.sequence_parallel = split.sequence;
        GPT m(cfg, d.B, alloc, layout, split.group, split.group);
        m.initialize(42);
        SpOut s{RankOut{}, token_range(split, d.B * d.T), {}};
        s.o.loss = m.forward(d.batch(), kCtx);
        m.backward();
        EXPECT_EQ(m.hidden_elems(d.B, d.T), s.rows.per * cfg.n_embd);
        s.o.grads = expand(m.params(), true);
        s.o.values = expand(m.params(), false);
        s.partial = marked_partial(m.params());
        return s;
      };
      const std::vector<SpOut> one = {one_device(run)};
      std::set<std::string> partial = {"ln_f.bias", "ln_f.weight"};
      for (int l = 0; l < cfg.n_layer; ++l)
        for (const char* p : {"ln_1.bias", "ln_1.weight", "ln_2.bias", "ln_2.weight"})
          partial.insert("h." + std::to_string(l) + "." + p);
      expect_sp_equivalent(one[0].o, on_sp_ranks(t, run), cfg.n_embd, partial, 1e-5, false);
    }
  }
}

}  // namespace
}  // namespace tessera::nn

namespace tessera::train {
namespace {

using testing::expect_resumed;
using testing::expect_same_run;
using testing::Reference;
using testing::run_reference;
using testing::temp_dir;
using testing::tp_config;
using testing::tp_one_rank;

struct Layout {
  int tp, dp, zero;
  std::string recompute = "none";
};

std::string layout_name(const Layout& l) {
  return "tp" + std::to_string(l.tp) + "_sp_dp" + std::to_string(l.dp) + "_zero" +
         std::to_string(l.zero) + (l.recompute == "none" ? "" : "_" + l.recompute);
}

// Weights within testing::kTensorParallelWeightRel, as for tensor parallelism alone
// (run_compare.h); losses and gradient norms within 1e-5 at every step.

class SequenceParallelTraining : public ::testing::TestWithParam<Layout> {};

TEST_P(SequenceParallelTraining, SameLossesNormsAndWeightsAsOneRank) {
  const Layout l = GetParam();
  const Reference& ref = tp_one_rank();
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.5) << "the reference run should learn";
  auto dir = temp_dir(layout_name(l));
  TrainConfig c = tp_config(dir);
  c.tp = l.tp;
  c.sp = true;
  c.dp = l.dp;
  c.zero = l.zero;
  c.recompute = nn::parse_recompute(l.recompute);
  expect_same_run(ref, run_reference("run", c, dir), testing::kTensorParallelWeightRel);
}

// A representative subset; TESSERA_TP_GRID=1 (scripts/tp_grid.sh) runs tp {2,4} x dp {1,2} x
// ZeRO {0,1,3} with --sp (tensor_parallel_test.cc covers the same grid without it).
std::vector<Layout> layouts() {
  const char* grid = std::getenv("TESSERA_TP_GRID");
  if (grid == nullptr || std::string(grid) != "1")
    return {{2, 1, 0}, {4, 1, 1}, {2, 2, 3}, {2, 2, 0, "selective"}, {2, 1, 3, "full"}};
  std::vector<Layout> v;
  for (int tp : {2, 4})
    for (int dp : {1, 2})
      for (int zero : {0, 1, 3}) v.push_back({tp, dp, zero});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layouts, SequenceParallelTraining, ::testing::ValuesIn(layouts()),
                         [](const auto& info) { return layout_name(info.param); });

// A micro-batch's rows that tp does not divide (one sequence of 15 tokens: 8 + 7 rows at tp = 2,
// 4 + 4 + 4 + 3 at tp = 4): the same training.
TEST(SequenceParallelTraining, RowsNotDivisibleByTp) {
  auto dir = temp_dir("sp_uneven");
  TrainConfig c = tp_config(dir);
  c.seq = 15;
  c.batch = 4;
  c.micro_batch = 1;
  c.steps = 6;
  const Reference ref = run_reference("one", c, dir);
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    c.tp = tp;
    c.sp = true;
    expect_same_run(ref, run_reference("tp" + std::to_string(tp), c, dir), 1e-5);
  }
}

// Sequence parallelism inside each stage of a pipeline: the stages pass their rows on. 4
// micro-batches of one sequence. The suite runs zero-bubble (its split backward keeps the
// all-gathered LayerNorm outputs for W); TESSERA_TP_GRID=1 every schedule, with and without full
// recomputation.
TEST(SequenceParallelTraining, InsidePipelineStages) {
  auto dir = temp_dir("sp_pp");
  TrainConfig c = tp_config(dir);
  c.layers = 3;
  c.batch = 4;
  c.micro_batch = 1;
  c.steps = 6;
  const Reference ref = run_reference("one", c, dir);
  const char* grid = std::getenv("TESSERA_TP_GRID");
  const bool all = grid != nullptr && std::string(grid) == "1";
  std::vector<std::string> schedules = {"zb-h1"}, modes = {"none"};
  if (all) schedules = {"gpipe", "1f1b", "interleaved", "zb-h1"}, modes = {"none", "full"};
  for (const std::string& schedule : schedules) {
    for (const std::string& mode : modes) {
      SCOPED_TRACE(schedule + " recompute " + mode);
      c.pp = 2;
      c.tp = 2;
      c.sp = true;
      c.schedule = parallel::parse_schedule(schedule);
      c.virtual_stages = schedule == "interleaved" ? 2 : 1;
      c.recompute = nn::parse_recompute(mode);
      expect_same_run(ref, run_reference("pp2_tp2_sp_" + schedule + "_" + mode, c, dir), 1e-5);
    }
  }
}

// Saved at tp = 2 with --sp halfway, resumed without it, at tp = 1, and at tp = 4 dp = 2 ZeRO-3
// with it: the same training (sequence parallelism changes no parameter shape).
TEST(SequenceParallelCheckpoint, ResumesWithoutItAndAtAnotherTp) {
  auto dir = temp_dir("sp_resume");
  TrainConfig c = tp_config(dir);
  c.tp = 2;
  c.sp = true;
  c.save = (dir / "a").string();
  c.save_every = 6;
  const TrainResult whole = run_training(c, nullptr);
  struct Resume {
    int tp, dp, zero;
    bool sp;
  };
  for (const Resume r : {Resume{2, 1, 0, false}, Resume{1, 1, 0, false}, Resume{4, 2, 3, true}}) {
    SCOPED_TRACE("tp " + std::to_string(r.tp) + (r.sp ? " sp" : "") + " dp " +
                 std::to_string(r.dp) + " zero " + std::to_string(r.zero));
    TrainConfig rc = tp_config(dir);
    rc.tp = r.tp;
    rc.sp = r.sp;
    rc.dp = r.dp;
    rc.zero = r.zero;
    rc.resume = (dir / "a" / "step-00000006").string();
    expect_resumed(whole, run_training(rc, nullptr), 6);
  }
}

// Validation and sampling under --sp through pipeline stages (tp alone: tensor_parallel_test.cc):
// evaluation and sampling pass each rank's rows between them.
TEST(SequenceParallelTraining, PipelineValidatesAndSamplesLikeOneRank) {
  auto dir = temp_dir("sp_pp_sample");
  TrainConfig c = tp_config(dir);
  c.layers = 3;
  c.steps = 2;
  c.val_fraction = 0.1;
  c.eval_every = 1;
  c.sample_tokens = 12;
  const TrainResult one = run_training(c, nullptr);
  c.pp = 2;
  c.tp = 2;
  c.sp = true;
  const TrainResult staged = run_training(c, nullptr);
  EXPECT_FALSE(one.sample.empty());
  EXPECT_EQ(staged.sample, one.sample);
  EXPECT_NEAR(staged.last_val_loss, one.last_val_loss, 1e-5 * one.last_val_loss);
}

TEST(SequenceParallelConfig, NeedsTensorParallelism) {
  auto dir = temp_dir("sp_bad");
  TrainConfig c = tp_config(dir);
  c.sp = true;
  try {
    run_training(c, nullptr);
    ADD_FAILURE() << "--sp without --tp ran";
  } catch (const ConfigError& e) {
    const std::string shown = e.render(flag_of);  // as the command line shows it
    EXPECT_NE(shown.find("--sp (sequence parallelism)"), std::string::npos) << shown;
    EXPECT_NE(shown.find("needs --tp 2 or more, got --tp 1"), std::string::npos) << shown;
  }
}

}  // namespace
}  // namespace tessera::train
