// The mixture-of-experts MLP (nn/moe.h, nn/moe_router.h): the router's rules on small cases
// worked by hand, then an MoE block against the float64 reference (values, and gradients by
// central differences of the reference objective, auxiliary losses included), with and without
// capacity dropping and dropout, and the model-level properties: recomputation bitwise, the
// zero-bubble split, parameter names.
#include "tessera/nn/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "gpt_reference.h"
#include "module_checks.h"
#include "tessera/comm/launch.h"
#include "tessera/nn/block.h"
#include "tessera/nn/gpt.h"
#include "tessera/nn/moe_router.h"

namespace tessera::nn {
namespace {

using testing::as_batch;
using testing::expect_gradient;
using testing::random_floats;
using testing::RefBatch;
using testing::RefModel;
using testing::Vec;

RefBatch make_batch(const GPTConfig& c, int B, int T, uint32_t seed, float p, int64_t first) {
  return testing::make_batch(c, B, T, seed, p, first, /*all_targets=*/true);
}

TEST(MoeRouter, TopKIsDescendingWithTiesToTheLowerIndexAndRenormalisedGates) {
  // Row 0: experts 1 and 3 tie for first, 0 and 2 for third.
  const float probs[] = {0.1f, 0.4f, 0.1f,  0.4f,  //
                         0.7f, 0.1f, 0.15f, 0.05f};
  int32_t ex[6];
  float gate[6];
  router_top_k(ex, gate, probs, 2, 4, 3);
  EXPECT_EQ(ex[0], 1);
  EXPECT_EQ(ex[1], 3);
  EXPECT_EQ(ex[2], 0);
  EXPECT_EQ(ex[3], 0);
  EXPECT_EQ(ex[4], 2);
  EXPECT_EQ(ex[5], 1);
  EXPECT_NEAR(gate[0], 0.4 / 0.9, 1e-7);
  EXPECT_NEAR(gate[2], 0.1 / 0.9, 1e-7);
  EXPECT_NEAR(gate[3] + gate[4] + gate[5], 1.0, 1e-7);
  EXPECT_NEAR(gate[3], 0.7 / 0.95, 1e-7);
}

TEST(MoeRouter, SoftmaxAndLogSumExp) {
  const float logits[] = {1.0f, 2.0f, 3.0f, 1000.0f, 1000.0f, 999.0f};
  float p[6], lse[2];
  router_softmax(p, lse, logits, 2, 3);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(p[2], std::exp(3.0) / z, 1e-7);
  EXPECT_NEAR(lse[0], std::log(z), 1e-6);
  EXPECT_NEAR(lse[1], 1000.0 + std::log(2.0 + std::exp(-1.0)), 1e-3);
  EXPECT_NEAR(p[3] + p[4] + p[5], 1.0, 1e-6);
}

// Capacity ceil(0.5 * 2 * 3 / 3) = 1 per expert and sequence, filled first choices first:
// tokens (0: 0,1) (1: 1,0) (2: 2,0) keep all first choices and drop every second choice. In
// (token, choice) order token 0 would have kept both and token 1 lost its first choice.
TEST(MoeRouter, CapacityIsPerSequenceFirstChoicesFirst) {
  MoeConfig m;
  m.experts = 3;
  m.top_k = 2;
  m.capacity_factor = 0.5f;
  EXPECT_EQ(expert_capacity(m, 3), 1);
  m.capacity_factor = 0.0f;
  EXPECT_EQ(expert_capacity(m, 3), 0);
  m.capacity_factor = 1.25f;  // ceil(1.25 * 2 * 8 / 3) = ceil(6.67)
  EXPECT_EQ(expert_capacity(m, 8), 7);
  const int32_t ex[] = {0, 1, 1, 0, 2, 0,   // sequence 0
                        0, 1, 1, 0, 2, 0};  // sequence 1: the same, with its own capacity
  uint8_t kept[12];
  EXPECT_EQ(router_capacity(kept, ex, 2, 3, 3, 2, 1), 6);
  const uint8_t want[] = {1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0};
  for (int a = 0; a < 12; ++a) EXPECT_EQ(kept[a], want[a]) << a;
  EXPECT_EQ(router_capacity(kept, ex, 2, 3, 3, 2, 0), 0);  // dropless
  for (int a = 0; a < 12; ++a) EXPECT_EQ(kept[a], 1);
}

// The dropped set of a sequence does not depend on the other sequences of its micro-batch.
TEST(MoeRouter, CapacityOfABatchIsTheConcatenationOfItsSequences) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> e(0, 3);
  const int B = 5, T = 7, K = 2;
  std::vector<int32_t> ex(B * T * K);
  for (int i = 0; i < B * T; ++i) {
    ex[i * K] = e(rng);
    ex[i * K + 1] = (ex[i * K] + 1 + e(rng) % 3) % 4;
  }
  std::vector<uint8_t> whole(ex.size()), one(T * K);
  router_capacity(whole.data(), ex.data(), B, T, 4, K, 3);
  for (int b = 0; b < B; ++b) {
    router_capacity(one.data(), ex.data() + b * T * K, 1, T, 4, K, 3);
    for (int a = 0; a < T * K; ++a) ASSERT_EQ(one[a], whole[b * T * K + a]) << b << " " << a;
  }
}

GPTConfig moe_config(float dropout, float capacity, int top_k = 2) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 6;
  c.vocab_size = 23;
  c.dropout = dropout;
  c.moe.experts = 4;
  c.moe.top_k = top_k;
  c.moe.every = 1;
  c.moe.capacity_factor = capacity;
  c.moe.aux_loss = 0.3f;  // large, so that the auxiliary gradients are visible in the check
  c.moe.z_loss = 0.05f;
  return c;
}

// Initialise, then add noise so that biases, gains and the router carry non-trivial values.
void init_noisy(ParameterSet& ps, uint64_t seed, float sd = 0.05f) {
  ps.initialize(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, sd);
  for (int i = 0; i < ps.size(); ++i) {
    float* w = ps.param_data(i);
    const float s = ps.infos()[i].name.find("router") != std::string::npos ? 20 * sd : sd;
    for (int64_t j = 0; j < ps.infos()[i].local_numel(); ++j) w[j] += s / sd * d(rng);
  }
}

struct BlockCase {
  float dropout, capacity;
  int top_k;
};

class MoeBlockTest : public ::testing::TestWithParam<BlockCase> {};

TEST_P(MoeBlockTest, MatchesReferenceValuesAndGradients) {
  const BlockCase k = GetParam();
  const GPTConfig cfg = moe_config(k.dropout, k.capacity, k.top_k);
  Allocator alloc("test");
  ParameterSet ps;
  const auto one = comm::one_rank();  // no tensor or expert parallelism
  Block block(ps, cfg, 1, TensorSplit{*one}, ExpertSplit{*one}, Recompute::None);
  ps.materialize(alloc);
  init_noisy(ps, 5);
  ASSERT_TRUE(ps.contains("h.1.mlp.router.weight"));
  ASSERT_TRUE(ps.contains("h.1.mlp.experts.3.c_proj.bias"));
  ASSERT_FALSE(ps.contains("h.1.mlp.c_fc.weight"));
  RefBatch rb = make_batch(cfg, 2, 6, 11, cfg.dropout, 4);
  rb.loss_scale = 0.5;
  const size_t n = static_cast<size_t>(rb.B) * rb.T * cfg.n_embd;
  const std::vector<float> x = random_floats(n, 1), dy = random_floats(n, 2);
  std::vector<float> y(n), dres(dy);
  Block::Record rec = block.make_record(3, alloc);
  Block::Workspace ws = block.make_workspace(3, alloc);
  block.forward(StepContext{rb.seed, rb.step, true, 0.5f}, as_batch(rb), x.data(), y.data(), rec,
                ws);
  block.backward(rec, dres.data(), ws);
  const MoeStats& st = block.moe()->stats();
  EXPECT_EQ(st.tokens, 12);
  EXPECT_EQ(st.assignments, 12 * k.top_k);
  if (k.capacity == 0) {
    EXPECT_EQ(st.dropped, 0);
  } else if (k.capacity < 1) {
    EXPECT_GT(st.dropped, 0) << "the case should drop";
  }

  RefModel ref = RefModel::from(cfg, ps);
  Vec xr(x.begin(), x.end());
  auto f = [&] {  // L = sum(block(x) * dy) + the auxiliary objective
    Vec out = xr;
    double aux = 0;
    testing::ref_block(ref, 1, rb, out, &aux);
    double s = aux;
    for (size_t i = 0; i < n; ++i) s += out[i] * dy[i];
    return s;
  };
  Vec yr = xr;
  testing::ref_block(ref, 1, rb, yr);
  for (size_t j = 0; j < n; ++j) ASSERT_NEAR(y[j], yr[j], 1e-5 * (1.0 + std::abs(yr[j]))) << j;
  expect_gradient("dx", dres, xr, f);
  for (int i = 0; i < ps.size(); ++i)
    expect_gradient(ps.infos()[i].name, ps.grad(i).to_vector(), ref.w.at(ps.infos()[i].name), f);
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeBlockTest,
                         ::testing::Values(BlockCase{0.0f, 0.0f, 2}, BlockCase{0.2f, 0.0f, 2},
                                           BlockCase{0.2f, 0.75f, 2}, BlockCase{0.0f, 0.5f, 1},
                                           BlockCase{0.0f, 0.0f, 4}));

// The whole model's loss against the reference; only every other block (l = 1) is MoE.
TEST(MoeModel, LossMatchesTheReferenceAndOnlyEveryNthBlockIsMoe) {
  GPTConfig cfg = moe_config(0.1f, 1.0f);
  cfg.moe.every = 2;
  Allocator alloc("test");
  GPT model(cfg, 2, alloc);
  init_noisy(model.params(), 12);
  init_noisy(model.params(ParamGroup::Experts), 13);
  EXPECT_TRUE(model.params().contains("h.0.mlp.c_fc.weight"));
  EXPECT_FALSE(model.params().contains("h.1.mlp.c_fc.weight"));
  EXPECT_TRUE(model.params().contains("h.1.mlp.router.weight"));
  EXPECT_TRUE(model.params(ParamGroup::Experts).contains("h.1.mlp.experts.0.c_fc.weight"));
  EXPECT_FALSE(model.params().contains("h.1.mlp.experts.0.c_fc.weight"));
  ASSERT_EQ(model.moe_layers().size(), 1u);
  const RefBatch rb = make_batch(cfg, 2, 6, 14, cfg.dropout, 0);
  const double loss = model.forward(as_batch(rb), StepContext{rb.seed, rb.step, true, 1.0f});
  const double want = testing::ref_loss_sum(RefModel::from(model), rb);
  EXPECT_NEAR(loss, want, 1e-5 * want);
}

std::vector<std::vector<float>> grads_of(const GPT& m) {
  std::vector<std::vector<float>> g;
  for (ParamGroup pg : {ParamGroup::Model, ParamGroup::Experts})
    for (int i = 0; i < m.params(pg).size(); ++i) g.push_back(m.params(pg).grad(i).to_vector());
  return g;
}

void expect_bitwise(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a[i].data(), b[i].data(), sizeof(float) * a[i].size())) << i;
}

// none, selective and full recomputation give bitwise-identical losses and gradients with
// capacity dropping and dropout on; the zero-bubble split backward the same within rounding.
TEST(MoeModel, RecomputeModesAreBitwiseIdenticalAndTheSplitBackwardAgrees) {
  const GPTConfig cfg = moe_config(0.15f, 0.75f);
  Allocator alloc("test");
  std::vector<RefBatch> mb;
  for (int m = 0; m < 2; ++m) mb.push_back(make_batch(cfg, 2, 6, 30 + m, cfg.dropout, 2 * m));
  auto run = [&](Recompute r, bool split, std::vector<double>* losses) {
    GPTLayout layout;
    layout.recompute = r;
    GPT model(cfg, 2, alloc, layout);
    init_noisy(model.params(), 10);
    init_noisy(model.params(ParamGroup::Experts), 11);
    std::vector<std::unique_ptr<StageRecord>> rec;
    for (int m = 0; m < 2; ++m) rec.push_back(model.make_record());
    for (int m = 0; m < 2; ++m)
      losses->push_back(model.forward(StepContext{mb[m].seed, mb[m].step, true, 0.02f},
                                      as_batch(mb[m]), *rec[m]));
    for (int m = 1; m >= 0; --m) {
      if (split) {
        model.backward_input(*rec[m]);
        model.backward_weight(*rec[m]);
      } else {
        model.backward(*rec[m]);
      }
    }
    EXPECT_EQ(model.moe_layers().front()->stats().tokens, 24) << "recomputation counted twice";
    return grads_of(model);
  };
  std::vector<double> l_none, l_sel, l_full, l_split;
  const auto none = run(Recompute::None, false, &l_none);
  const auto sel = run(Recompute::Selective, false, &l_sel);
  const auto full = run(Recompute::Full, false, &l_full);
  const auto split = run(Recompute::Full, true, &l_split);
  EXPECT_EQ(l_none, l_sel);
  EXPECT_EQ(l_none, l_full);
  EXPECT_EQ(l_none, l_split);
  {
    SCOPED_TRACE("selective");
    expect_bitwise(none, sel);
  }
  {
    SCOPED_TRACE("full");
    expect_bitwise(none, full);
  }
  // The split moves the head's wte gradient after the embedding's (another summation order):
  // equal within rounding.
  for (size_t i = 0; i < none.size(); ++i) {
    double d = 0, nrm = 0;
    for (size_t j = 0; j < none[i].size(); ++j) {
      d += std::pow(none[i][j] - split[i][j], 2);
      nrm += std::pow(none[i][j], 2);
    }
    EXPECT_LE(std::sqrt(d), 1e-6 * std::sqrt(nrm) + 1e-12) << "split backward, gradient " << i;
  }
}

TEST(MoeModel, ConfigErrorsNameTheFlag) {
  auto message = [](GPTConfig c) -> std::string {
    try {
      validate(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  GPTConfig c = moe_config(0, 0);
  c.moe.top_k = 5;
  EXPECT_NE(message(c).find("--moe-top-k 5"), std::string::npos) << message(c);
  c.moe.top_k = 2;
  c.moe.every = 3;
  EXPECT_NE(message(c).find("--moe-every 3"), std::string::npos) << message(c);
  c.moe.every = 1;
  c.moe.capacity_factor = -1;
  EXPECT_NE(message(c).find("--moe-capacity-factor"), std::string::npos) << message(c);
  c.moe.capacity_factor = 0;
  c.moe.aux_loss = -0.1f;
  EXPECT_NE(message(c).find("--moe-aux-loss"), std::string::npos) << message(c);
}

}  // namespace
}  // namespace tessera::nn
