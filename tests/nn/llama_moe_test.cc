// The Llama family's mixture of experts (nn/swiglu_moe_mlp.h, nn/moe_experts.h) and the router's
// new rules (nn/moe_router.h): sigmoid scores, gates not renormalised, the selection bias of
// auxiliary-loss-free balancing. The router's gradients against central differences of a float64
// objective; the block's against central differences of itself (auxiliary losses, the gated
// shared expert and dense blocks included); Mixtral's and Qwen2-MoE's names; the costs against
// what the model registers; recomputation bitwise. (Against Hugging Face's own Mixtral and
// Qwen2-MoE: tests/train/hf_reference_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/nn/block.h"
#include "tessera/nn/gpt.h"
#include "tessera/nn/gpt_costs.h"
#include "tessera/nn/moe_router.h"

namespace tessera::nn {
namespace {

TEST(MoeRouterRules, SigmoidScoresAndTheirNormalisedShares) {
  const float logits[] = {0.0f, 2.0f, -1.0f};
  float s[3], p[3], lse[1];
  router_sigmoid(s, p, lse, logits, 1, 3);
  const double s1 = 1 / (1 + std::exp(-2.0)), s2 = 1 / (1 + std::exp(1.0));
  EXPECT_NEAR(s[0], 0.5, 1e-7);
  EXPECT_NEAR(s[1], s1, 1e-7);
  EXPECT_NEAR(s[2], s2, 1e-7);
  EXPECT_NEAR(p[1], s1 / (0.5 + s1 + s2), 1e-7);
  EXPECT_NEAR(lse[0], std::log(1 + std::exp(2.0) + std::exp(-1.0)), 1e-6);
}

// The bias moves the choice, never the gates; without renormalisation the gates are the scores.
TEST(MoeRouterRules, TheSelectionBiasChoosesAndTheScoresWeigh) {
  const float scores[] = {0.5f, 0.3f, 0.15f, 0.05f};
  const float bias[] = {0.0f, 0.0f, 0.0f, 1.0f};  // expert 3 first, whatever its score
  int32_t ex[2];
  float gate[2];
  router_top_k(ex, gate, scores, 1, 4, 2, bias, /*renormalize=*/false);
  EXPECT_EQ(ex[0], 3);
  EXPECT_EQ(ex[1], 0);
  EXPECT_EQ(gate[0], 0.05f);
  EXPECT_EQ(gate[1], 0.5f);
  router_top_k(ex, gate, scores, 1, 4, 2, bias, /*renormalize=*/true);
  EXPECT_NEAR(gate[0], 0.05 / 0.55, 1e-7);
  router_top_k(ex, gate, scores, 1, 4, 2);  // no bias: GPT-2's rule
  EXPECT_EQ(ex[0], 0);
  EXPECT_EQ(ex[1], 1);
  EXPECT_NEAR(gate[0], 0.5 / 0.8, 1e-7);
}

// The router's objective in float64 for fixed choices: sum_j dgate_j gate_j + the balance and z
// terms of moe_router.h, per token.
double router_objective(const std::vector<double>& l, const std::vector<int32_t>& ex,
                        const std::vector<float>& dgate, int B, int T, int E, int k, bool sigmoid,
                        bool renormalize, double bw, double zw) {
  double J = 0;
  for (int b = 0; b < B; ++b) {
    std::vector<double> counts(E, 0.0);
    for (int a = 0; a < T * k; ++a) counts[ex[b * T * k + a]] += 1;
    for (int t = 0; t < T; ++t) {
      const int n = b * T + t;
      const double* x = l.data() + n * E;
      double m = x[0], z = 0;
      for (int e = 1; e < E; ++e) m = std::max(m, x[e]);
      for (int e = 0; e < E; ++e) z += std::exp(x[e] - m);
      const double lse = m + std::log(z);
      std::vector<double> s(E), p(E);
      double sum = 0;
      for (int e = 0; e < E; ++e) {
        s[e] = sigmoid ? 1 / (1 + std::exp(-x[e])) : std::exp(x[e] - lse);
        sum += s[e];
      }
      for (int e = 0; e < E; ++e) p[e] = sigmoid ? s[e] / sum : s[e];
      double S = 0;
      for (int j = 0; j < k; ++j) S += s[ex[n * k + j]];
      for (int j = 0; j < k; ++j)
        J += dgate[n * k + j] * (renormalize ? s[ex[n * k + j]] / S : s[ex[n * k + j]]);
      for (int e = 0; e < E; ++e) J += bw * E * counts[e] / (T * k) * p[e];
      J += zw * lse * lse;
    }
  }
  return J;
}

TEST(MoeRouterRules, GradientsOfEveryScoreAndGateRuleMatchCentralDifferences) {
  const int B = 2, T = 3, E = 5, k = 2, N = B * T;
  const float bw = 0.7f, zw = 0.3f;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> logits(N * E), dgate(N * k);
  for (float& v : logits) v = d(rng);
  for (float& v : dgate) v = d(rng);
  const std::vector<float> bias = {0.2f, -0.1f, 0.0f, 0.3f, -0.2f};
  for (const bool sigmoid : {false, true})
    for (const bool renormalize : {false, true}) {
      SCOPED_TRACE(std::string(sigmoid ? "sigmoid" : "softmax") +
                   (renormalize ? ", renormalised" : ", plain gates"));
      std::vector<float> scores(N * E), probs(N * E), lse(N), gate(N * k), dl(N * E);
      std::vector<int32_t> ex(N * k);
      if (sigmoid)
        router_sigmoid(scores.data(), probs.data(), lse.data(), logits.data(), N, E);
      else
        router_softmax(probs.data(), lse.data(), logits.data(), N, E);
      const float* s = sigmoid ? scores.data() : probs.data();
      router_top_k(ex.data(), gate.data(), s, N, E, k, bias.data(), renormalize);
      if (sigmoid)
        router_backward_sigmoid(dl.data(), dgate.data(), scores.data(), probs.data(), lse.data(),
                                logits.data(), ex.data(), gate.data(), B, T, E, k, bw, zw,
                                renormalize);
      else
        router_backward(dl.data(), dgate.data(), probs.data(), lse.data(), ex.data(), gate.data(),
                        B, T, E, k, bw, zw, renormalize);
      std::vector<double> l(logits.begin(), logits.end());
      for (int i = 0; i < N * E; ++i) {
        const double h = 1e-5, keep = l[i];
        l[i] = keep + h;
        const double up = router_objective(l, ex, dgate, B, T, E, k, sigmoid, renormalize, bw, zw);
        l[i] = keep - h;
        const double dn = router_objective(l, ex, dgate, B, T, E, k, sigmoid, renormalize, bw, zw);
        l[i] = keep;
        EXPECT_NEAR(dl[i], (up - dn) / (2 * h), 2e-6) << "logit " << i;
      }
    }
}

// Qwen2-MoE-like: 3 blocks, block 1 dense (mlp_only_layers), experts of their own width, a gated
// shared expert.
GPTConfig qwen_moe(bool sigmoid = false) {
  GPTConfig c;
  c.arch = Arch::Llama;
  c.hf_model_type = "qwen2_moe";
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.block_size = 6;
  c.vocab_size = 29;
  c.ffn_dim = 40;
  c.qkv_bias = true;
  c.tie_embeddings = false;
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.ffn_dim = 12;
  c.moe.shared_ffn_dim = 20;
  c.moe.shared_gate = true;
  c.moe.dense_layers = {1};
  c.moe.renormalize = false;
  c.moe.aux_loss = 0.3f;
  c.moe.z_loss = 0.05f;
  if (sigmoid) c.moe.score = RouterScore::Sigmoid;
  return c;
}

int64_t registered(const GPT& m) {
  int64_t n = 0;
  for (ParamGroup g : {ParamGroup::Model, ParamGroup::Experts})
    for (const ParamInfo& p : m.params(g).infos()) n += p.global_numel();
  return n;
}

TEST(LlamaMoe, NamesAreMixtralsOrQwen2MoesAndDenseLayersStayDense) {
  Allocator alloc("test");
  GPT q(qwen_moe(), 1, alloc);
  const ParameterSet& ps = q.params();
  const ParameterSet& es = q.params(ParamGroup::Experts);
  EXPECT_EQ(ps.param("model.layers.0.mlp.gate.weight").shape(), (Shape{4, 16}));
  EXPECT_EQ(ps.param("model.layers.0.mlp.shared_expert.gate_proj.weight").shape(), (Shape{20, 16}));
  EXPECT_EQ(ps.param("model.layers.0.mlp.shared_expert.down_proj.weight").shape(), (Shape{16, 20}));
  EXPECT_EQ(ps.param("model.layers.0.mlp.shared_expert_gate.weight").shape(), (Shape{1, 16}));
  EXPECT_EQ(es.param("model.layers.2.mlp.experts.3.up_proj.weight").shape(), (Shape{12, 16}));
  EXPECT_EQ(es.param("model.layers.2.mlp.experts.3.down_proj.weight").shape(), (Shape{16, 12}));
  EXPECT_EQ(ps.param("model.layers.1.mlp.gate_proj.weight").shape(), (Shape{40, 16}));  // dense
  EXPECT_FALSE(es.contains("model.layers.1.mlp.experts.0.up_proj.weight"));
  EXPECT_EQ(q.moe_layers().size(), 2u);

  GPTConfig m = qwen_moe();
  m.hf_model_type = "";  // a new model: Mixtral when Mixtral expresses it
  EXPECT_EQ(m.hf_type(), "qwen2_moe");
  m.moe.shared_ffn_dim = 0, m.moe.shared_gate = false, m.moe.dense_layers.clear();
  m.moe.renormalize = true, m.qkv_bias = false;
  EXPECT_EQ(m.hf_type(), "mixtral");
  GPT x(m, 1, alloc);
  EXPECT_EQ(x.params().param("model.layers.2.block_sparse_moe.gate.weight").shape(),
            (Shape{4, 16}));
  EXPECT_EQ(x.params(ParamGroup::Experts)
                .param("model.layers.0.block_sparse_moe.experts.1.w1.weight")
                .shape(),
            (Shape{12, 16}));  // gate
  EXPECT_TRUE(x.params(ParamGroup::Experts)
                  .contains("model.layers.0.block_sparse_moe.experts.1.w3.weight"));
  EXPECT_TRUE(x.params(ParamGroup::Experts)
                  .contains("model.layers.0.block_sparse_moe.experts.1.w2.weight"));
}

// gpt_costs.h counts what the model registers (both parameter sets, each half of every block),
// a token's active parameters (top_k experts and the shared expert), and the blocks' FLOPs.
TEST(LlamaMoe, CostsAreTheParametersTheModelRegisters) {
  const GPTConfig c = qwen_moe();
  Allocator alloc("test");
  GPT m(c, 1, alloc);
  EXPECT_EQ(total_params(c), registered(m));
  const int64_t C = 16, expert = 3 * C * 12;
  EXPECT_EQ(active_params_without_wpe(c), total_params(c) - 2 * (4 - 2) * expert);
  for (int layer = 0; layer < 3; ++layer) {
    GPTLayout mlp_half;
    mlp_half.first_unit = mlp_half.last_unit = layer + 1;
    mlp_half.starts_mid_block = true;
    GPT b(c, 1, alloc, mlp_half);
    EXPECT_EQ(registered(b), mlp_half_params(c, layer, c.moe.experts)) << "layer " << layer;
  }
  const BlockFlops moe = block_flops(c, 0, 6), dense = block_flops(c, 1, 6);
  EXPECT_EQ(moe.mlp, 2.0 * 3 * C * 12);
  EXPECT_EQ(moe.router, 2.0 * C * 4);
  EXPECT_EQ(moe.shared_expert, 2.0 * 3 * C * 20 + 2 * C);
  EXPECT_EQ(dense.mlp, 2.0 * 3 * C * 40);
  EXPECT_EQ(dense.shared_expert, 0.0);
  EXPECT_EQ(moe.mlp_half(mlp_passes(c, 0)), 2 * moe.mlp + moe.router + moe.shared_expert);
}

void init_noisy(ParameterSet& ps, uint64_t seed) {
  ps.initialize(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, 0.1f);
  for (int i = 0; i < ps.size(); ++i) {
    float* w = ps.param_data(i);
    const bool router = ps.infos()[i].name.ends_with("mlp.gate.weight");
    for (int64_t j = 0; j < ps.infos()[i].local_numel(); ++j) w[j] += (router ? 10 : 1) * d(rng);
  }
}

// The block's input and parameter gradients against central differences of the block itself
// (J = sum(y * dy) + the auxiliary objective), for the Qwen2-MoE-like block (softmax, plain
// gates) and a sigmoid router with renormalised gates and a selection bias.
TEST(LlamaMoe, BlockGradientsMatchCentralDifferences) {
  for (const bool sigmoid : {false, true}) {
    SCOPED_TRACE(sigmoid ? "sigmoid" : "softmax");
    GPTConfig cfg = qwen_moe(sigmoid);
    cfg.moe.renormalize = sigmoid;
    Allocator alloc("test");
    ParameterSet ps;
    const auto one = comm::one_rank();
    Block block(ps, cfg, 0, TensorSplit{*one}, ExpertSplit{*one}, Recompute::None);
    ps.materialize(alloc);
    init_noisy(ps, 5);
    if (sigmoid) block.moe()->set_score_bias({0.05f, -0.02f, 0.0f, 0.01f});
    const int B = 2, T = 6;
    const size_t n = static_cast<size_t>(B) * T * cfg.n_embd;
    std::mt19937 rng(9);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(n), dy(n);
    for (float& v : x) v = d(rng);
    for (float& v : dy) v = d(rng);
    const float loss_scale = 0.25f;
    const Batch b{nullptr, nullptr, B, T, 0};
    Block::Record rec = block.make_record(B, alloc);
    Block::Workspace ws = block.make_workspace(B, alloc);
    auto objective = [&] {  // in float64 from the float forward
      std::vector<float> y(n);
      block.moe()->reset_stats();
      block.forward(StepContext{1, 0, true, loss_scale}, b, x.data(), y.data(), rec, ws);
      const MoeStats& st = block.moe()->stats();
      double J = cfg.moe.aux_loss * loss_scale * T * st.balance_sum +
                 cfg.moe.z_loss * loss_scale * st.z_sum;
      for (size_t i = 0; i < n; ++i) J += static_cast<double>(y[i]) * dy[i];
      return J;
    };
    objective();
    std::vector<float> dres(dy);
    block.backward(rec, dres.data(), ws);
    auto check = [&](const char* what, float* value, float grad) {
      const float h = 1e-2f, keep = *value;
      *value = keep + h;
      const double up = objective();
      *value = keep - h;
      const double dn = objective();
      *value = keep;
      const double fd = (up - dn) / (2 * h);
      EXPECT_NEAR(grad, fd, 3e-3 + 3e-2 * std::abs(fd)) << what;
    };
    for (size_t i = 0; i < n; i += 37) check("dx", &x[i], dres[i]);
    for (int p = 0; p < ps.size(); ++p) {
      const ParamInfo& info = ps.infos()[p];
      const std::vector<float> g = ps.grad(p).to_vector();
      for (int64_t j = 0; j < info.local_numel(); j += std::max<int64_t>(1, info.local_numel() / 5))
        check(info.name.c_str(), ps.param_data(p) + j, g[static_cast<size_t>(j)]);
    }
  }
}

std::vector<std::vector<float>> grads_of(const GPT& m) {
  std::vector<std::vector<float>> g;
  for (ParamGroup pg : {ParamGroup::Model, ParamGroup::Experts})
    for (int i = 0; i < m.params(pg).size(); ++i) g.push_back(m.params(pg).grad(i).to_vector());
  return g;
}

// none, selective and full recomputation give bitwise-identical losses and gradients; the
// zero-bubble split computes the mixture in BI and agrees within rounding.
TEST(LlamaMoe, RecomputeModesAreBitwiseIdenticalAndTheSplitBackwardAgrees) {
  const GPTConfig cfg = qwen_moe(/*sigmoid=*/true);
  Allocator alloc("test");
  std::vector<int32_t> tokens(2 * 6), targets(2 * 6);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = (7 * i + 3) % 29, targets[i] = (5 * i + 1) % 29;
  auto run = [&](Recompute r, bool split, std::vector<double>* losses) {
    GPTLayout layout;
    layout.recompute = r;
    GPT model(cfg, 1, alloc, layout);
    init_noisy(model.params(), 10);
    init_noisy(model.params(ParamGroup::Experts), 11);
    for (const MixtureOfExperts* m : model.moe_layers()) m->set_score_bias({0.1f, 0, -0.1f, 0});
    std::vector<std::unique_ptr<StageRecord>> rec;
    for (int m = 0; m < 2; ++m) rec.push_back(model.make_record());
    for (int m = 0; m < 2; ++m)
      losses->push_back(model.forward(StepContext{3, 0, true, 0.05f},
                                      Batch{tokens.data() + 6 * m, targets.data() + 6 * m, 1, 6, m},
                                      *rec[m]));
    for (int m = 1; m >= 0; --m) {
      if (split) {
        model.backward_input(*rec[m]);
        model.backward_weight(*rec[m]);
      } else {
        model.backward(*rec[m]);
      }
    }
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
  ASSERT_EQ(none.size(), full.size());
  for (size_t i = 0; i < none.size(); ++i) {
    EXPECT_EQ(none[i], sel[i]) << "selective, gradient " << i;
    EXPECT_EQ(none[i], full[i]) << "full, gradient " << i;
    double diff = 0, norm = 0;
    for (size_t j = 0; j < none[i].size(); ++j) {
      diff += std::pow(none[i][j] - split[i][j], 2);
      norm += std::pow(none[i][j], 2);
    }
    EXPECT_LE(std::sqrt(diff), 1e-6 * std::sqrt(norm) + 1e-12) << "split backward, gradient " << i;
  }
}

TEST(LlamaMoe, ConfigErrorsNameTheSetting) {
  auto message = [](const GPTConfig& c) -> std::string {
    try {
      validate(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  GPTConfig c = qwen_moe();
  c.moe.shared_ffn_dim = 0;
  EXPECT_NE(message(c).find("--moe-shared-gate"), std::string::npos) << message(c);
  c = qwen_moe();
  c.hf_model_type = "mixtral";
  EXPECT_NE(message(c).find("a Mixtral model"), std::string::npos) << message(c);
  c = qwen_moe();
  c.moe.dense_layers = {3};
  EXPECT_NE(message(c).find("dense layer 3"), std::string::npos) << message(c);
  GPTConfig g;  // GPT-2
  g.moe.experts = 4;
  g.moe.ffn_dim = 8;
  EXPECT_NE(message(g).find("--moe-ffn-dim"), std::string::npos) << message(g);
}

}  // namespace
}  // namespace tessera::nn
