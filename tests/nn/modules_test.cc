// Each module of the model on its own against the float64 reference (values, and gradients by
// central differences of the reference), then the properties the composable model promises:
// micro-batches in flight, recomputation, and a model cut into pipeline stages.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpt_reference.h"
#include "module_checks.h"
#include "tessera/comm/launch.h"
#include "tessera/nn/block.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/gpt.h"
#include "tessera/nn/head.h"

namespace tessera::nn {
namespace {

using testing::as_batch;
using testing::ctx_of;
using testing::expect_gradient;
using testing::make_batch;
using testing::random_floats;
using testing::RefBatch;
using testing::RefModel;
using testing::Vec;

GPTConfig tiny(float dropout) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 6;
  c.vocab_size = 23;
  c.dropout = dropout;
  return c;
}

// Initialise, then add noise so that biases and gains carry non-trivial values.
void init_noisy(ParameterSet& ps, uint64_t seed) {
  ps.initialize(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (int i = 0; i < ps.size(); ++i) {
    float* w = ps.param_data(i);
    for (int64_t j = 0; j < ps.infos()[i].local_numel(); ++j) w[j] += d(rng);
  }
}

void expect_close(const std::string& what, const float* got, const Vec& ref, double tol) {
  for (size_t j = 0; j < ref.size(); ++j)
    ASSERT_NEAR(got[j], ref[j], tol * (1.0 + std::abs(ref[j]))) << what << "[" << j << "]";
}

class ModuleTest : public ::testing::TestWithParam<float> {};  // dropout probability

TEST_P(ModuleTest, BlockMatchesReferenceValuesAndGradients) {
  const GPTConfig cfg = tiny(GetParam());
  Allocator alloc("test");
  ParameterSet ps;
  const auto one = comm::one_rank();  // no tensor or expert parallelism
  Block block(ps, cfg, 1, TensorSplit{*one}, ExpertSplit{*one}, Recompute::None);
  ps.materialize(alloc);
  init_noisy(ps, 5);
  const RefBatch rb = make_batch(cfg, 2, 5, 11, cfg.dropout, 4);
  const size_t n = static_cast<size_t>(rb.B) * rb.T * cfg.n_embd;
  const std::vector<float> x = random_floats(n, 1), dy = random_floats(n, 2);
  std::vector<float> y(n), dres(dy);
  Block::Record rec = block.make_record(3, alloc);
  Block::Workspace ws = block.make_workspace(3, alloc);
  block.forward(ctx_of(rb, 1.0f), as_batch(rb), x.data(), y.data(), rec, ws);
  block.backward(rec, dres.data(), ws);

  RefModel ref = RefModel::from(cfg, ps);
  Vec xr(x.begin(), x.end());
  auto f = [&] {  // L = sum(block(x) * dy)
    Vec out = xr;
    testing::ref_block(ref, 1, rb, out);
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += out[i] * dy[i];
    return s;
  };
  Vec yr = xr;
  testing::ref_block(ref, 1, rb, yr);
  expect_close("y", y.data(), yr, 1e-5);
  expect_gradient("dx", dres, xr, f);
  for (int i = 0; i < ps.size(); ++i)
    expect_gradient(ps.infos()[i].name, ps.grad(i).to_vector(), ref.w.at(ps.infos()[i].name), f);
}

TEST_P(ModuleTest, EmbeddingMatchesReferenceValuesAndGradients) {
  const GPTConfig cfg = tiny(GetParam());
  Allocator alloc("test");
  ParameterSet ps;
  const auto one = comm::one_rank();
  Embedding emb(ps, cfg, TensorSplit{*one});
  ps.materialize(alloc);
  init_noisy(ps, 6);
  const RefBatch rb = make_batch(cfg, 3, 6, 12, cfg.dropout, 1);
  const size_t n = static_cast<size_t>(rb.B) * rb.T * cfg.n_embd;
  const std::vector<float> dy = random_floats(n, 3);
  std::vector<float> x(n), dx(dy);
  Embedding::Record rec = emb.make_record(3, alloc);
  emb.forward(ctx_of(rb, 1.0f), as_batch(rb), x.data(), rec);
  emb.backward(rec, dx.data());

  RefModel ref = RefModel::from(cfg, ps);
  auto f = [&] {
    const Vec out = testing::ref_embedding(ref, rb);
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += out[i] * dy[i];
    return s;
  };
  expect_close("x", x.data(), testing::ref_embedding(ref, rb), 1e-6);
  for (int i = 0; i < ps.size(); ++i)
    expect_gradient(ps.infos()[i].name, ps.grad(i).to_vector(), ref.w.at(ps.infos()[i].name), f);
}

TEST_P(ModuleTest, HeadMatchesReferenceLossAndGradients) {
  const GPTConfig cfg = tiny(GetParam());
  Allocator alloc("test");
  ParameterSet ps;
  const auto one = comm::one_rank();
  Head head(ps, cfg, -1, TensorSplit{*one});  // owns its wte copy, as on a last pipeline stage
  ps.materialize(alloc);
  init_noisy(ps, 7);
  const RefBatch rb = make_batch(cfg, 2, 6, 13, cfg.dropout, 0);
  const size_t n = static_cast<size_t>(rb.B) * rb.T * cfg.n_embd;
  const std::vector<float> x = random_floats(n, 4);
  std::vector<float> dx(n), scratch(n);
  const float scale = 0.25f;
  Head::Record rec = head.make_record(3, alloc);
  const double loss = head.forward(ctx_of(rb, scale), as_batch(rb), x.data(), rec);
  head.backward(rec, dx.data(), scratch.data());

  RefModel ref = RefModel::from(cfg, ps);
  Vec xr(x.begin(), x.end());
  auto f = [&] { return scale * testing::ref_head_loss_sum(ref, rb, xr); };
  const double ref_loss = testing::ref_head_loss_sum(ref, rb, xr);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
  expect_gradient("dx", dx, xr, f);
  for (int i = 0; i < ps.size(); ++i)
    expect_gradient(ps.infos()[i].name, ps.grad(i).to_vector(), ref.w.at(ps.infos()[i].name), f);
}

INSTANTIATE_TEST_SUITE_P(Dropout, ModuleTest, ::testing::Values(0.0f, 0.2f));

// ---- the composed model --------------------------------------------------------------------

std::vector<std::vector<float>> grads_of(const GPT& m) {
  std::vector<std::vector<float>> g;
  for (int i = 0; i < m.params().size(); ++i) g.push_back(m.params().grad(i).to_vector());
  return g;
}

void expect_bitwise(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b, const ParameterSet& ps) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a[i].data(), b[i].data(), sizeof(float) * a[i].size()))
        << ps.infos()[i].name;
}

// Three micro-batches, each its own record: the gradients depend only on which backward runs
// when, not on how many forwards are in flight. Accumulation (+=) is order-sensitive in fp32, so
// the bitwise comparison keeps the backward order (B1 B2 B3); the reverse order (a pipeline's
// last-in first-out) matches within rounding.
TEST(ComposedModel, MicroBatchesInFlightGiveTheSameGradients) {
  const GPTConfig cfg = tiny(0.1f);
  Allocator alloc("test");
  std::vector<RefBatch> mb;
  for (int m = 0; m < 3; ++m) mb.push_back(make_batch(cfg, 2, 6, 20 + m, cfg.dropout, 2 * m));
  auto run = [&](const std::string& order, double* loss) {
    GPT model(cfg, 2, alloc);
    init_noisy(model.params(), 9);
    std::vector<std::unique_ptr<StageRecord>> rec;
    for (int m = 0; m < 3; ++m) rec.push_back(model.make_record());
    *loss = 0;
    for (size_t i = 0; i < order.size(); i += 2) {
      const int m = order[i + 1] - '1';
      if (order[i] == 'F')
        *loss += model.forward(ctx_of(mb[m], 0.01f), as_batch(mb[m]), *rec[m]);
      else
        model.backward(*rec[m]);
    }
    return grads_of(model);
  };
  double l_seq, l_flight, l_lifo;
  const auto seq = run("F1B1F2B2F3B3", &l_seq);
  const auto flight = run("F1F2F3B1B2B3", &l_flight);
  const auto lifo = run("F1F2F3B3B2B1", &l_lifo);
  GPT shape(cfg, 2, alloc);
  EXPECT_EQ(l_seq, l_flight);
  EXPECT_EQ(l_seq, l_lifo);
  expect_bitwise(seq, flight, shape.params());
  for (size_t i = 0; i < seq.size(); ++i) {
    double d = 0, nrm = 0;
    for (size_t j = 0; j < seq[i].size(); ++j) {
      d += std::pow(seq[i][j] - lifo[i][j], 2);
      nrm += std::pow(seq[i][j], 2);
    }
    EXPECT_LE(std::sqrt(d), 1e-6 * std::sqrt(nrm) + 1e-12) << shape.params().infos()[i].name;
  }
}

// none, selective and full recomputation give bitwise-identical losses and gradients (dropout
// on: recomputed masks are drawn from the same coordinates).
TEST(ComposedModel, RecomputeModesAreBitwiseIdentical) {
  const GPTConfig cfg = tiny(0.15f);
  Allocator alloc("test");
  std::vector<RefBatch> mb;
  for (int m = 0; m < 2; ++m) mb.push_back(make_batch(cfg, 2, 6, 30 + m, cfg.dropout, 2 * m));
  auto run = [&](Recompute r, std::vector<double>* losses) {
    GPTLayout layout;
    layout.recompute = r;
    GPT model(cfg, 2, alloc, layout);
    init_noisy(model.params(), 10);
    std::vector<std::unique_ptr<StageRecord>> rec;
    for (int m = 0; m < 2; ++m) rec.push_back(model.make_record());
    for (int m = 0; m < 2; ++m)
      losses->push_back(model.forward(ctx_of(mb[m], 0.02f), as_batch(mb[m]), *rec[m]));
    for (int m = 1; m >= 0; --m) model.backward(*rec[m]);
    return grads_of(model);
  };
  std::vector<double> l_none, l_sel, l_full;
  const auto none = run(Recompute::None, &l_none);
  const auto sel = run(Recompute::Selective, &l_sel);
  const auto full = run(Recompute::Full, &l_full);
  GPT shape(cfg, 2, alloc);
  EXPECT_EQ(l_none, l_sel);
  EXPECT_EQ(l_none, l_full);
  expect_bitwise(none, sel, shape.params());
  expect_bitwise(none, full, shape.params());
}

// The model cut into two stages, the hidden state and its gradient handed between them: the same
// loss bitwise, the same gradients bitwise except the tied wte, whose two stage copies sum to the
// one-device gradient. Cuts between blocks and inside one (after its attention half), with each
// recompute mode and with the zero-bubble split of backward.
struct StageCut {
  const char* name;
  int last_of_first;    // the first stage's last unit
  bool mid_block;       // ... of which it holds only the attention half
  Recompute recompute;  // on both stages
  bool split_backward;  // backward_input, then backward_weight
};

class TwoStages : public ::testing::TestWithParam<StageCut> {};

TEST_P(TwoStages, EqualTheWholeModel) {
  const StageCut cut = GetParam();
  const GPTConfig cfg = tiny(0.1f);
  Allocator alloc("test");
  const RefBatch rb = make_batch(cfg, 2, 6, 40, cfg.dropout, 0);
  GPT whole(cfg, 2, alloc);
  init_noisy(whole.params(), 11);
  const double loss = whole.forward(as_batch(rb), ctx_of(rb, 0.05f));
  whole.backward();

  GPTLayout first, second;
  first.last_unit = cut.last_of_first;
  first.ends_mid_block = cut.mid_block;
  second.first_unit = cut.last_of_first + (cut.mid_block ? 0 : 1);
  second.starts_mid_block = cut.mid_block;
  first.recompute = second.recompute = cut.recompute;
  GPT s0(cfg, 2, alloc, first), s1(cfg, 2, alloc, second);
  EXPECT_TRUE(s0.has_embedding() && !s0.has_head());
  EXPECT_TRUE(!s1.has_embedding() && s1.has_head());
  // Every parameter of the whole model on exactly one stage (wte on both).
  EXPECT_EQ(s0.params().size() + s1.params().size(), whole.params().size() + 1);
  for (GPT* s : {&s0, &s1})
    for (int i = 0; i < s->params().size(); ++i) {
      const std::string& name = s->params().infos()[i].name;
      const auto w = whole.params().param(name).to_vector();
      std::memcpy(s->params().param_data(i), w.data(), sizeof(float) * w.size());
    }
  auto r0 = s0.make_record();
  auto r1 = s1.make_record();
  Batch b = as_batch(rb);
  EXPECT_EQ(s0.forward(ctx_of(rb, 0.05f), b, *r0), 0.0);
  const size_t n = static_cast<size_t>(rb.B) * rb.T * cfg.n_embd;
  std::memcpy(s1.input(*r1), s0.output(*r0), sizeof(float) * n);  // "send forward"
  Batch b1 = b;
  b1.tokens = nullptr;  // a later stage needs no tokens
  EXPECT_EQ(s1.forward(ctx_of(rb, 0.05f), b1, *r1), loss);
  if (cut.split_backward) {
    s1.backward_input(*r1);
    s0.backward_input(*r0, s1.input_grad(*r1));  // "send backward"
    s1.backward_weight(*r1);
    s0.backward_weight(*r0);
  } else {
    s1.backward(*r1);
    s0.backward(*r0, s1.input_grad(*r1));  // "send backward"
  }

  EXPECT_TRUE(s0.params().infos()[s0.params().index("wte.weight")].reduction.over_embedding_group);
  const ParamInfo& copy = s1.params().infos()[s1.params().index("wte.weight")];
  EXPECT_TRUE(copy.reduction.over_embedding_group);
  EXPECT_FALSE(copy.reduction.counts_in_norm);
  for (const GPT* s : {&s0, &s1})
    for (int i = 0; i < s->params().size(); ++i) {
      const std::string& name = s->params().infos()[i].name;
      if (name == "wte.weight") continue;
      const auto got = s->params().grad(i).to_vector();
      const auto want = whole.params().grad(name).to_vector();
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * got.size())) << name;
    }
  const auto g0 = s0.params().grad("wte.weight").to_vector();
  const auto g1 = s1.params().grad("wte.weight").to_vector();
  const auto want = whole.params().grad("wte.weight").to_vector();
  for (size_t j = 0; j < want.size(); ++j)
    ASSERT_NEAR(g0[j] + g1[j], want[j], 1e-6 * (1 + std::abs(want[j]))) << j;
}

INSTANTIATE_TEST_SUITE_P(
    Cuts, TwoStages,
    ::testing::Values(StageCut{"between_blocks", 1, false, Recompute::None, false},
                      StageCut{"in_block_0", 1, true, Recompute::None, false},
                      StageCut{"in_block_1", 2, true, Recompute::None, false},
                      StageCut{"in_block_1_selective", 2, true, Recompute::Selective, false},
                      StageCut{"in_block_1_full", 2, true, Recompute::Full, false},
                      StageCut{"in_block_0_zero_bubble", 1, true, Recompute::None, true},
                      StageCut{"in_block_1_full_zero_bubble", 2, true, Recompute::Full, true}),
    [](const auto& info) { return std::string(info.param.name); });

// A stage boundary inside the embedding, the head, or both ends in one block is a ConfigError.
TEST(TwoStages, MidBlockCutsOnlyInsideABlock) {
  const GPTConfig cfg = tiny(0.0f);
  Allocator alloc("test");
  auto make = [&](int first, bool starts_mid, int last, bool ends_mid) {
    GPTLayout l;
    l.first_unit = first;
    l.starts_mid_block = starts_mid;
    l.last_unit = last;
    l.ends_mid_block = ends_mid;
    GPT g(cfg, 2, alloc, l);
  };
  EXPECT_THROW(make(0, true, 1, false), ConfigError);  // the embedding has no halves
  EXPECT_THROW(make(1, false, 3, true), ConfigError);  // nor the head
  EXPECT_THROW(make(2, true, 2, true), ConfigError);   // neither half of block 1
  EXPECT_NO_THROW(make(2, true, 2, false));            // block 1's MLP half alone
  EXPECT_NO_THROW(make(1, true, 2, true));             // MLP of block 0, attention of block 1
}

// Activation bytes per block (fp32, docs/PERFORMANCE.md): with b sequences of s tokens, h
// features and a heads, one block keeps
//   none       b s (64 h + 16 + 2 h [dropout masks]) + 4 a s b (the fused attention's log-sum-exp)
//   selective  b s (60 h + 16 + 2 h) (no attention output atty nor its log-sum-exp)
//   full       4 b s h (its output, the next block's input)
// and the allocator's Activations total grows by exactly that per block: nothing grows with s^2.
TEST(ComposedModel, ActivationMemoryPerBlockMatchesTheFormula) {
  for (float p : {0.0f, 0.1f}) {
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      auto record_bytes = [&](int layers) {
        GPTConfig cfg = tiny(p);
        cfg.n_layer = layers;
        cfg.n_embd = 16;
        cfg.block_size = 8;
        GPTLayout layout;
        layout.recompute = r;
        Allocator alloc("test");
        GPT model(cfg, 3, alloc, layout);
        const size_t before = alloc.in_use(MemCategory::Activations);
        auto rec = model.make_record();
        return static_cast<double>(alloc.in_use(MemCategory::Activations) - before);
      };
      const double per_block = record_bytes(3) - record_bytes(2);
      const double b = 3, s = 8, h = 16, a = 2;
      const double masks = p > 0 ? 2 * b * s * h : 0;
      double want = 4 * b * s * h;  // the block's output
      if (r != Recompute::Full) want += b * s * (56 * h + 16) + masks;
      if (r == Recompute::None) want += 4 * b * s * h + 4 * a * s * b;  // atty, lse
      EXPECT_EQ(per_block, want) << "recompute " << to_string(r) << ", dropout " << p;
    }
  }
}

}  // namespace
}  // namespace tessera::nn
