#include "tessera/nn/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gpt_reference.h"
#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/nn/block.h"
#include "tessera/nn/gpt_costs.h"

namespace tessera::nn {
namespace {

using testing::RefBatch;
using testing::RefModel;

GPTConfig tiny(float dropout = 0.0f, int n_embd = 16) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = n_embd;
  c.block_size = 8;
  c.vocab_size = 37;
  c.dropout = dropout;
  return c;
}

// Initialises, then adds noise to every parameter so that biases, gains and every path carry
// non-trivial values (a freshly initialised GPT has zero biases and unit gains).
void init_noisy(GPT& m, uint64_t seed) {
  m.initialize(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, 0.05f);
  float* w = m.params().flat_params().f32();
  for (const ParamInfo& p : m.params().infos())
    for (int64_t i = 0; i < p.local_numel(); ++i) w[p.offset + i] += d(rng);
}

RefBatch make_batch(const GPTConfig& c, int B, int T, uint32_t seed, float p) {
  RefBatch b;
  b.B = B;
  b.T = T;
  b.seed = 77;
  b.step = 5;
  b.p = p;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(tok(rng));
    b.targets.push_back(i % 7 == 3 ? -1 : tok(rng));  // some ignored targets
  }
  return b;
}

int count_targets(const RefBatch& b) {
  int n = 0;
  for (int32_t t : b.targets) n += t >= 0;
  return n;
}

Batch as_batch(const RefBatch& r) {
  return Batch{r.tokens.data(), r.targets.empty() ? nullptr : r.targets.data(), r.B, r.T,
               r.first_sample};
}

StepContext ctx_for(const RefBatch& r, float scale) {
  return StepContext{r.seed, r.step, true, scale};
}

struct RefCase {
  float dropout;
  int B, T;
  int C;
  int stride;  // check every stride-th element of each parameter (1: all); keeps the test fast
};

class ReferenceTest : public ::testing::TestWithParam<RefCase> {};

// Loss and every gradient against the float64 reference (width 8 checks every element; the
// width-16 case checks every 9th element of every parameter, to stay fast under sanitizers).
// Reference gradients are central differences of the float64 loss (h = 1e-6; their error, ~1e-9
// absolute, is far below the tolerance). Metric per element: |g - r| <= 1e-4 * (|r| + 0.01 * max|r|
// over the tensor): a relative 1e-4 bound with an absolute floor at 1% of the tensor's largest
// gradient, since fp32 rounding makes near-zero elements (cancellation) relatively inexact.
TEST_P(ReferenceTest, LossAndGradientsMatchFloat64Reference) {
  const auto [p, B, T, C, stride] = GetParam();
  const GPTConfig cfg = tiny(p, C);
  Allocator alloc("test");
  GPT model(cfg, 3, alloc);
  init_noisy(model, 1234);
  RefBatch rb = make_batch(cfg, B, T, 42, p);
  const float scale = 1.0f / static_cast<float>(count_targets(rb));
  const double loss = model.forward(as_batch(rb), ctx_for(rb, scale));
  model.backward();
  RefModel ref = RefModel::from(model);
  const double ref_loss = testing::ref_loss_sum(ref, rb);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
  double worst = 0.0;
  std::string worst_name;
  for (int i = 0; i < model.params().size(); ++i) {
    const std::string& name = model.params().infos()[i].name;
    const auto g = model.params().grad(i).to_vector();
    testing::Vec& w = ref.w.at(name);
    testing::Vec r(w.size(), 0.0);
    const double h = 1e-6;
    for (size_t j = 0; j < w.size(); j += stride) {
      const double saved = w[j];
      w[j] = saved + h;
      const double lp = testing::ref_loss_sum(ref, rb);
      w[j] = saved - h;
      const double lm = testing::ref_loss_sum(ref, rb);
      w[j] = saved;
      r[j] = scale * (lp - lm) / (2 * h);
    }
    double rmax = 0.0;
    for (double v : r) rmax = std::max(rmax, std::abs(v));
    for (size_t j = 0; j < w.size(); j += stride) {
      const double denom = std::abs(r[j]) + 0.01 * rmax;
      const double rel = std::abs(g[j] - r[j]) / (denom > 0 ? denom : 1.0);
      if (rel > worst) worst = rel, worst_name = name + "[" + std::to_string(j) + "]";
      ASSERT_LE(rel, 1e-4) << name << "[" << j << "]: model " << g[j] << " vs reference " << r[j];
    }
  }
  RecordProperty("worst_gradient_error", std::to_string(worst) + " at " + worst_name);
}

INSTANTIATE_TEST_SUITE_P(Configs, ReferenceTest,
                         ::testing::Values(RefCase{0.0f, 3, 8, 8, 1}, RefCase{0.0f, 2, 5, 8, 1},
                                           RefCase{0.1f, 3, 8, 8, 1}, RefCase{0.1f, 3, 8, 16, 9}));

// Central differences of the fp32 model itself (dropout on, fixed masks) at a few elements of
// every parameter, as a check independent of the reference. fp32 noise limits this to ~1%.
TEST(GPT, FiniteDifferencesOfTheFp32ModelWithDropout) {
  const GPTConfig cfg = tiny(0.1f);
  Allocator alloc("test");
  GPT model(cfg, 3, alloc);
  init_noisy(model, 7);
  RefBatch rb = make_batch(cfg, 3, 8, 9, cfg.dropout);
  const float scale = 1.0f / static_cast<float>(count_targets(rb));
  model.forward(as_batch(rb), ctx_for(rb, scale));
  model.backward();
  std::mt19937 rng(3);
  int checked = 0;
  for (int i = 0; i < model.params().size(); ++i) {
    const auto g = model.params().grad(i).to_vector();
    float* w = model.params().param(i).f32();
    size_t big = 0;
    for (size_t j = 0; j < g.size(); ++j)
      if (std::abs(g[j]) > std::abs(g[big])) big = j;
    for (size_t j : {big, static_cast<size_t>(rng() % g.size())}) {
      if (std::abs(g[j]) < 1e-3) continue;
      const float saved = w[j], h = 1e-2f;
      w[j] = saved + h;
      const double lp = scale * model.forward(as_batch(rb), ctx_for(rb, scale));
      w[j] = saved - h;
      const double lm = scale * model.forward(as_batch(rb), ctx_for(rb, scale));
      w[j] = saved;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[j], fd, 2e-2 * std::abs(fd) + 2e-4)
          << model.params().infos()[i].name << "[" << j << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(GPT, InferenceLogitsMatchReference) {
  const GPTConfig cfg = tiny();
  Allocator alloc("test");
  GPT model(cfg, 3, alloc);
  init_noisy(model, 5);
  RefBatch rb = make_batch(cfg, 2, 6, 1, 0.0f);
  rb.targets.clear();
  EXPECT_EQ(model.forward(as_batch(rb), StepContext{0, 0, false, 1.0f}), 0.0);
  testing::Vec ref_logits;
  testing::ref_loss_sum(RefModel::from(model), rb, &ref_logits);
  for (size_t i = 0; i < ref_logits.size(); ++i)
    ASSERT_NEAR(model.logits()[i], ref_logits[i], 1e-5 * (1 + std::abs(ref_logits[i])));
  EXPECT_THROW(model.backward(), Error);  // no targets
}

TEST(GPT, EvalModeIgnoresDropout) {
  Allocator alloc("test");
  GPT with(tiny(0.3f), 3, alloc), without(tiny(0.0f), 3, alloc);
  with.initialize(1);
  without.initialize(1);
  RefBatch rb = make_batch(tiny(), 3, 8, 2, 0.0f);
  StepContext eval{7, 3, false, 1.0f};
  EXPECT_EQ(with.forward(as_batch(rb), eval), without.forward(as_batch(rb), eval));
}

TEST(GPT, DeterministicAcrossRunsAndInstances) {
  const GPTConfig cfg = tiny(0.1f);
  Allocator alloc("test");
  RefBatch rb = make_batch(cfg, 3, 8, 11, cfg.dropout);
  auto run = [&](GPT& m) {
    m.params().zero_grads();
    const double l = m.forward(as_batch(rb), ctx_for(rb, 0.01f));
    m.backward();
    return std::make_pair(l, m.params().flat_grads().to_vector());
  };
  GPT a(cfg, 3, alloc), b(cfg, 3, alloc);
  a.initialize(99);
  b.initialize(99);
  const auto ra = run(a), ra2 = run(a), rb2 = run(b);
  EXPECT_EQ(ra.first, ra2.first);
  EXPECT_EQ(ra.first, rb2.first);
  EXPECT_TRUE(ra.second == ra2.second);
  EXPECT_TRUE(ra.second == rb2.second);
  EXPECT_EQ(a.params().flat_params().to_vector(), b.params().flat_params().to_vector());
}

// Rows are global samples: two micro-batches (samples [0,1) and [1,3)) accumulate the same loss
// and gradients as the whole batch, dropout included.
TEST(GPT, MicroBatchesAccumulateToTheFullBatch) {
  const GPTConfig cfg = tiny(0.2f);
  Allocator alloc("test");
  GPT model(cfg, 3, alloc);
  model.initialize(4);
  RefBatch full = make_batch(cfg, 3, 8, 12, cfg.dropout);
  const float scale = 1.0f / static_cast<float>(count_targets(full));
  const double l_full = model.forward(as_batch(full), ctx_for(full, scale));
  model.backward();
  const auto g_full = model.params().flat_grads().to_vector();
  model.params().zero_grads();
  double l_parts = 0.0;
  for (auto [s0, n] : {std::pair{0, 1}, std::pair{1, 2}}) {
    RefBatch part = full;
    part.B = n;
    part.first_sample = s0;
    part.tokens.assign(full.tokens.begin() + s0 * 8, full.tokens.begin() + (s0 + n) * 8);
    part.targets.assign(full.targets.begin() + s0 * 8, full.targets.begin() + (s0 + n) * 8);
    l_parts += model.forward(as_batch(part), ctx_for(part, scale));
    model.backward();
  }
  EXPECT_NEAR(l_parts, l_full, 1e-6 * l_full);
  const auto g_parts = model.params().flat_grads().to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < g_full.size(); ++i) {
    num += (g_parts[i] - g_full[i]) * (g_parts[i] - g_full[i]);
    den += g_full[i] * g_full[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
}

TEST(GPT, ParameterNamesShapesAndFlops) {
  GPTConfig c;  // L=4, C=256, heads=4, T=128, V=512
  Allocator alloc("test");
  GPT m(c, 1, alloc);
  const ParameterSet& ps = m.params();
  EXPECT_EQ(ps.size(), 2 + 12 * 4 + 2);
  EXPECT_EQ(ps.param("h.3.attn.c_attn.weight").shape(), (Shape{256, 768}));
  EXPECT_EQ(ps.param("h.0.mlp.c_proj.weight").shape(), (Shape{1024, 256}));
  EXPECT_EQ(ps.param("wpe.weight").shape(), (Shape{128, 256}));
  const int64_t per_layer = 12 * 256 * 256 + 13 * 256;
  EXPECT_EQ(m.num_params_without_wpe(), 4 * per_layer + 512 * 256 + 2 * 256);
  // 6 N + 6 L C T: causal attention, half of PaLM's dense 12 L C T (nn/gpt_costs.h).
  EXPECT_DOUBLE_EQ(m.flops_per_token(128), 6.0 * m.num_params_without_wpe() + 6.0 * 4 * 256 * 128);
  EXPECT_FALSE(ps.infos()[ps.index("h.0.ln_1.weight")].weight_decay);
  EXPECT_TRUE(ps.infos()[ps.index("wte.weight")].weight_decay);
}

// nn/gpt_costs.h is the one count of the model: it agrees with the parameters a built model
// registers (every module, MoE blocks included, and each half of a block on its own), and the
// pipeline split's unit costs are 3x its forward FLOPs.
TEST(GPTCosts, CountsAreTheParametersTheModelRegisters) {
  for (int experts : {0, 4}) {
    GPTConfig c;
    c.n_layer = 3;
    c.n_embd = 32;
    c.n_head = 4;
    c.block_size = 16;
    c.vocab_size = 50;
    c.moe.experts = experts;
    c.moe.every = 2;  // block 1 is an MoE block
    Allocator alloc("test");
    GPT m(c, 1, alloc);
    int64_t registered = 0;
    for (ParamGroup g : {ParamGroup::Model, ParamGroup::Experts})
      for (const ParamInfo& p : m.params(g).infos()) registered += p.global_numel();
    EXPECT_EQ(total_params(c), registered) << experts << " experts";
    EXPECT_EQ(m.num_params_without_wpe(), registered - 16 * 32);
    // The halves of a block register what the counts give them.
    for (int layer = 0; layer < 3; ++layer) {
      GPTLayout attn_half, mlp_half;
      attn_half.first_unit = attn_half.last_unit = layer + 1;
      attn_half.ends_mid_block = true;
      mlp_half.first_unit = mlp_half.last_unit = layer + 1;
      mlp_half.starts_mid_block = true;
      GPT a(c, 1, alloc, attn_half), b(c, 1, alloc, mlp_half);
      int64_t in_b = 0;
      for (ParamGroup g : {ParamGroup::Model, ParamGroup::Experts})
        for (const ParamInfo& p : b.params(g).infos()) in_b += p.global_numel();
      EXPECT_EQ(a.params().global_numel(), attention_half_params(c));
      EXPECT_EQ(in_b, mlp_half_params(c, layer, c.moe.experts)) << "layer " << layer;
    }
  }
}

TEST(GPT, FirstNonFiniteNamesTheTensor) {
  Allocator alloc("test");
  GPT m(tiny(), 3, alloc);
  m.initialize(1);
  RefBatch rb = make_batch(tiny(), 3, 8, 2, 0.0f);
  m.forward(as_batch(rb), ctx_for(rb, 0.1f));
  m.backward();
  EXPECT_EQ(m.first_non_finite(), "");
  m.params().grad("h.1.mlp.c_fc.weight").f32()[3] = NAN;
  EXPECT_EQ(m.first_non_finite(), "h.1.mlp.c_fc.weight (gradient)");
  m.params().param("h.0.ln_2.bias").f32()[0] = INFINITY;
  EXPECT_EQ(m.first_non_finite(), "h.0.ln_2.bias");
  m.params().zero_grads();
  m.params().param("h.0.ln_2.bias").f32()[0] = 0.0f;
  m.params().param("h.1.attn.c_proj.weight").f32()[0] = NAN;
  EXPECT_EQ(m.first_non_finite(), "h.1.attn.c_proj.weight");
}

TEST(GPT, BadConfigsAndBatchesAreClearErrors) {
  GPTConfig c = tiny();
  c.n_head = 3;
  EXPECT_THROW(validate(c), ConfigError);
  try {
    validate(c);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_head (3) must divide n_embd (16)"), std::string::npos);
  }
  for (auto bad :
       {&GPTConfig::n_layer, &GPTConfig::n_embd, &GPTConfig::block_size, &GPTConfig::vocab_size}) {
    GPTConfig b = tiny();
    b.*bad = 0;
    EXPECT_THROW(validate(b), ConfigError);
  }
  GPTConfig d = tiny(1.0f);
  EXPECT_THROW(validate(d), ConfigError);
  Allocator alloc("test");
  EXPECT_THROW(GPT(c, 1, alloc), ConfigError);

  GPT m(tiny(), 2, alloc);
  m.initialize(1);
  std::vector<int32_t> tokens(2 * 9, 1), targets(2 * 9, 1);
  StepContext ctx;
  EXPECT_THROW(m.forward(Batch{tokens.data(), targets.data(), 2, 9}, ctx), ShapeError);  // T > 8
  EXPECT_THROW(m.forward(Batch{tokens.data(), targets.data(), 3, 8}, ctx), ShapeError);  // B > 2
  tokens[1 * 8 + 2] = 37;
  try {
    m.forward(Batch{tokens.data(), targets.data(), 2, 8, 10}, ctx);
    ADD_FAILURE() << "no error for an out-of-range token";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("token id 37"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sample 11"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 2"), std::string::npos) << msg;
  }
  tokens[1 * 8 + 2] = 1;
  targets[5] = -2;
  EXPECT_THROW(m.forward(Batch{tokens.data(), targets.data(), 2, 8}, ctx), ConfigError);
  GPT fresh(tiny(), 2, alloc);
  EXPECT_THROW(fresh.backward(), Error);
}

}  // namespace
}  // namespace tessera::nn

namespace tessera::nn {
namespace {
namespace decode {

// Generation with a key/value cache (KvCache, GPT::decode): for every model family (GPT-2,
// GPT-2 with a mixture of experts, the Llama family with grouped-query, multi-query and plain
// heads, q/k/v biases, tied and untied heads, Llama 3's rope scaling, dropout configured but off
// in inference, recomputation), decoding a sequence token by token, and in chunks (a prefill of
// several tokens, then steps), gives the logits of the full forward at every position; a full
// cache refuses more, and a reset one starts over; models that cannot decode say why.

GPTConfig gpt2(int block_size = 24) {
  GPTConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = block_size;
  c.vocab_size = 53;
  c.dropout = 0.1f;  // configured, off in inference
  return c;
}

GPTConfig gpt2_moe() {
  GPTConfig c = gpt2();
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.every = 2;  // block 1 MoE, blocks 0 and 2 dense
  return c;
}

// 4 query heads over 2 key/value heads, a SwiGLU width of 48.
GPTConfig llama(int kv_heads = 2, bool tied = true) {
  GPTConfig c;
  c.arch = Arch::Llama;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = kv_heads;
  c.n_embd = 32;
  c.ffn_dim = 48;
  c.block_size = 24;
  c.vocab_size = 53;
  c.rope_theta = 500000.0;
  c.tie_embeddings = tied;
  c.dropout = 0.1f;
  c.ln_eps = 1e-6f;
  return c;
}

struct Case {
  std::string name;
  GPTConfig cfg;
  Recompute recompute = Recompute::None;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"gpt2", gpt2()});
  v.push_back({"gpt2_recompute_full", gpt2(), Recompute::Full});
  v.push_back({"gpt2_moe", gpt2_moe()});
  v.push_back({"llama_gqa_tied", llama(2, true)});
  v.push_back({"llama_gqa_untied", llama(2, false)});
  v.push_back({"llama_mqa", llama(1, false)});
  GPTConfig mha = llama(4, true);
  v.push_back({"llama_mha_selective", mha, Recompute::Selective});
  GPTConfig qwen = llama(2, false);
  qwen.qkv_bias = true;
  qwen.o_bias = true;
  v.push_back({"qwen2_qkv_bias", qwen});
  GPTConfig l3 = llama(2, true);
  l3.rope_scaling = {8.0, 1.0, 4.0, 16.0};  // original_max_positions 16 < block_size: all bands
  v.push_back({"llama3_rope_scaling", l3});
  return v;
}

// Initialises, then adds noise to every parameter (both sets) so that biases, gains and every path
// carry non-trivial values.
void init_noisy_all(GPT& m, uint64_t seed) {
  m.initialize(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (ParamGroup g : {ParamGroup::Model, ParamGroup::Experts}) {
    ParameterSet& ps = m.params(g);
    if (ps.size() == 0) continue;
    float* w = ps.flat_params().f32();
    for (const ParamInfo& p : ps.infos())
      for (int64_t i = 0; i < p.local_numel(); ++i) w[p.offset + i] += d(rng);
  }
}

std::vector<int32_t> random_tokens(const GPTConfig& c, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = tok(rng);
  return t;
}

// The logits [T, V] of the full forward of tokens[0, T) (inference).
std::vector<float> full_logits(GPT& m, const std::vector<int32_t>& tokens) {
  const int T = static_cast<int>(tokens.size()), V = m.config().vocab_size;
  m.forward(Batch{tokens.data(), nullptr, 1, T, 0}, StepContext{3, 7, false, 1.0f});
  return std::vector<float>(m.logits(), m.logits() + int64_t{T} * V);
}

// max_j |got_j - want_j| / max_j |want_j| of one position's logits.
double relative_error(const float* got, const float* want, int V) {
  double diff = 0, scale = 0;
  for (int j = 0; j < V; ++j) {
    diff = std::max(diff, std::abs(static_cast<double>(got[j]) - want[j]));
    scale = std::max(scale, std::abs(static_cast<double>(want[j])));
  }
  return diff / scale;
}

constexpr double kTolerance = 1e-5;

// Decodes `tokens` in steps of chunks[0], chunks[1], ... (the rest one by one) and compares each
// position's logits with the full forward's. Returns the worst relative error.
double worst_over_chunks(GPT& m, const std::vector<int32_t>& tokens, const std::vector<int>& chunks,
                         const std::string& what) {
  const int T = static_cast<int>(tokens.size()), V = m.config().vocab_size;
  const std::vector<float> want = full_logits(m, tokens);
  KvCache cache = m.make_kv_cache();
  std::vector<float> got(static_cast<size_t>(T) * V);
  double worst = 0;
  size_t c = 0;
  for (int pos = 0; pos < T;) {
    const int n = c < chunks.size() ? std::min(chunks[c++], T - pos) : 1;
    EXPECT_EQ(cache.length(), pos);
    float* rows = got.data() + int64_t{pos} * V;
    if (n == 1 && pos % 2 == 1) {  // the form that returns the last row
      const float* last = m.decode(tokens.data() + pos, n, cache);
      std::copy(last, last + V, rows);
    } else {
      m.decode(tokens.data() + pos, n, cache, rows);
    }
    for (int i = pos; i < pos + n; ++i) {
      const double e = relative_error(got.data() + int64_t{i} * V, want.data() + int64_t{i} * V, V);
      EXPECT_LE(e, kTolerance) << what << ": position " << i << " (step of " << n << " at " << pos
                               << ")";
      worst = std::max(worst, e);
    }
    pos += n;
  }
  EXPECT_EQ(cache.length(), T);
  return worst;
}

class Decode : public ::testing::TestWithParam<Case> {};

TEST_P(Decode, TokenByTokenAndInChunksGiveTheFullForwardsLogitsAtEveryPosition) {
  const Case& k = GetParam();
  Allocator alloc("decode");
  GPTLayout layout;
  layout.recompute = k.recompute;
  GPT m(k.cfg, 2, alloc, layout);
  init_noisy_all(m, 11);
  ASSERT_TRUE(m.can_decode()) << m.decode_unsupported();
  const int T = k.cfg.block_size;
  const std::vector<int32_t> tokens = random_tokens(k.cfg, T, 5);
  double worst = worst_over_chunks(m, tokens, {}, k.name + " token by token");
  worst = std::max(worst, worst_over_chunks(m, tokens, {7, 1, 1, 5, 3}, k.name + " in chunks"));
  worst = std::max(worst, worst_over_chunks(m, tokens, {T}, k.name + " one prefill"));
  // Shorter sequences (the full forward of T' < block_size tokens) as well.
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 9);
  worst = std::max(worst, worst_over_chunks(m, head, {4}, k.name + " 9 tokens"));
  RecordProperty("worst_relative_error", std::to_string(worst));
  std::printf("[          ] %s: worst relative error %.3g\n", k.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Families, Decode, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Prefills of more than one block of queries (kernels::kAttentionBlock = 64).
TEST(DecodeLong, PrefillsLongerThanOneAttentionBlock) {
  for (GPTConfig c : {gpt2(80), llama(2, false)}) {
    c.block_size = 80;
    c.n_layer = 2;
    Allocator alloc("decode");
    GPT m(c, 1, alloc);
    init_noisy_all(m, 12);
    const std::vector<int32_t> tokens = random_tokens(c, 80, 6);
    worst_over_chunks(m, tokens, {70, 1, 2}, std::string(to_string(c.arch)) + " 70 + 1 + 2 + 1...");
    worst_over_chunks(m, tokens, {1, 66}, std::string(to_string(c.arch)) + " 1 + 66 + 1...");
  }
}

TEST(DecodeCache, AFullCacheRefusesMoreAndAResetOneStartsOver) {
  for (const GPTConfig& c : {gpt2(), llama()}) {
    Allocator alloc("decode");
    GPT m(c, 1, alloc);
    init_noisy_all(m, 13);
    const int T = c.block_size, V = c.vocab_size;
    const std::vector<int32_t> tokens = random_tokens(c, T + 1, 7);
    KvCache cache = m.make_kv_cache();
    EXPECT_EQ(cache.capacity(), T);
    EXPECT_EQ(cache.layers(), c.n_layer);
    EXPECT_EQ(cache.width(), int64_t{c.llama() ? c.kv_heads() : c.n_head} * c.head_dim());
    m.decode(tokens.data(), T - 2, cache);
    EXPECT_THROW(m.decode(tokens.data() + T - 2, 3, cache), ShapeError);  // 1 past the end
    EXPECT_EQ(cache.length(), T - 2);                                     // unchanged
    m.decode(tokens.data() + T - 2, 2, cache);
    EXPECT_TRUE(cache.full());
    EXPECT_THROW(m.decode(tokens.data() + T, 1, cache), ShapeError);
    // Reset: the window slid by one, prefilled at [0, T), is the full forward of that window.
    cache.reset();
    EXPECT_EQ(cache.length(), 0);
    const std::vector<int32_t> window(tokens.begin() + 1, tokens.end());
    std::vector<float> got(static_cast<size_t>(T) * V);
    m.decode(window.data(), T, cache, got.data());
    const std::vector<float> want = full_logits(m, window);
    for (int i = 0; i < T; ++i)
      EXPECT_LE(relative_error(got.data() + int64_t{i} * V, want.data() + int64_t{i} * V, V),
                kTolerance)
          << to_string(c.arch) << " position " << i;
    // A smaller cache holds fewer positions.
    KvCache small = m.make_kv_cache(5);
    EXPECT_EQ(small.capacity(), 5);
    m.decode(tokens.data(), 5, small);
    EXPECT_THROW(m.decode(tokens.data(), 1, small), ShapeError);
    EXPECT_THROW(m.make_kv_cache(T + 1), ConfigError);
    EXPECT_THROW(m.make_kv_cache(-1), ConfigError);
  }
}

// The cache holds each layer's keys (after rotation, in a rotary model) and values: those the
// full forward's record keeps in its qkv.
TEST(DecodeCache, HoldsTheForwardsKeysAndValues) {
  for (const GPTConfig& c : {gpt2(), llama(2, false)}) {
    Allocator alloc("decode");
    GPT m(c, 1, alloc);
    init_noisy_all(m, 14);
    const int T = c.block_size;
    const std::vector<int32_t> tokens = random_tokens(c, T, 8);
    std::unique_ptr<StageRecord> rec = m.make_record();
    m.forward(StepContext{0, 0, false, 1.0f}, Batch{tokens.data(), nullptr, 1, T, 0}, *rec);
    const GPT::Record& r = static_cast<const GPT::Record&>(*rec);
    KvCache cache = m.make_kv_cache();
    for (int t = 0; t < T; ++t) m.decode(tokens.data() + t, 1, cache);
    const int64_t Wk = cache.width(), q = int64_t{c.n_head} * c.head_dim(), row = q + 2 * Wk;
    for (int l = 0; l < c.n_layer; ++l) {
      const float* qkv = r.blocks[static_cast<size_t>(l)].attention->qkv.f32();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < Wk; ++j) {
          const float k = qkv[t * row + q + j], v = qkv[t * row + q + Wk + j];
          ASSERT_NEAR(cache.keys(l)[t * Wk + j], k, 1e-5 * (1 + std::abs(k)))
              << to_string(c.arch) << " layer " << l << " position " << t;
          ASSERT_NEAR(cache.values(l)[t * Wk + j], v, 1e-5 * (1 + std::abs(v)))
              << to_string(c.arch) << " layer " << l << " position " << t;
        }
    }
  }
}

TEST(DecodeCache, RejectsBadTokensAndAnotherModelsCache) {
  const GPTConfig c = gpt2();
  Allocator alloc("decode");
  GPT m(c, 1, alloc), other(c, 1, alloc);
  KvCache cache = m.make_kv_cache();
  const int32_t bad[] = {3, c.vocab_size};
  EXPECT_THROW(m.decode(bad, 2, cache), ConfigError);
  EXPECT_EQ(cache.length(), 0);
  const int32_t ok[] = {3};
  EXPECT_THROW(other.decode(ok, 1, cache), Error);
  EXPECT_THROW(m.decode(ok, 0, cache), ShapeError);
}

TEST(DecodeCache, LivesInTheActivationsCategory) {
  const GPTConfig c = llama(2, false);
  Allocator alloc("decode");
  GPT m(c, 1, alloc);
  const size_t before = alloc.in_use(MemCategory::Activations);
  const size_t params = alloc.in_use(MemCategory::Parameters);
  {
    KvCache cache = m.make_kv_cache();
    // At least the keys and values of every layer and position.
    const size_t kv = sizeof(float) * 2 * c.n_layer * c.block_size * cache.width();
    EXPECT_GE(alloc.in_use(MemCategory::Activations), before + kv);
    EXPECT_EQ(alloc.in_use(MemCategory::Parameters), params);
  }
  EXPECT_EQ(alloc.in_use(MemCategory::Activations), before);  // freed with the cache
}

TEST(DecodeCache, ModelsThatCannotDecodeSayWhy) {
  Allocator alloc("decode");
  {  // a pipeline stage
    GPTLayout stage;
    stage.last_unit = 2;
    GPT m(gpt2(), 1, alloc, stage);
    EXPECT_FALSE(m.can_decode());
    EXPECT_NE(m.decode_unsupported().find("whole model"), std::string::npos);
    EXPECT_THROW(m.make_kv_cache(), ConfigError);
  }
  {  // tensor parallelism
    auto tp = comm::placeholder_group(2, 0);
    auto ep = comm::placeholder_group(1, 0);
    GPT m(llama(), 1, alloc, GPTLayout{}, *tp, *ep);
    EXPECT_NE(m.decode_unsupported().find("tensor parallelism"), std::string::npos);
    EXPECT_THROW(m.make_kv_cache(), ConfigError);
  }
  {  // ZeRO-3: the parameters are not resident
    GPTLayout zero3;
    zero3.full_params = false;
    GPT m(gpt2(), 1, alloc, zero3);
    EXPECT_NE(m.decode_unsupported().find("resident"), std::string::npos);
  }
  {  // a mixture of experts with a capacity
    GPTConfig c = gpt2_moe();
    c.moe.capacity_factor = 1.25f;
    GPT m(c, 1, alloc);
    EXPECT_NE(m.decode_unsupported().find("dropless"), std::string::npos);
    EXPECT_THROW(m.make_kv_cache(), ConfigError);
  }
}

}  // namespace decode

namespace long_context {

using decode::gpt2;
using decode::llama;
using decode::random_tokens;

// The fused attention (kernels/flash_attention.h) holds no [B, heads, T, T] tensor: a training
// step of a small model at T = 2048, dropout on, in every recompute mode, stays under a capacity
// that one block's probabilities under the materialising kernel would exceed by themselves
// (4 heads x 2048^2 floats = 64 MiB, twice that with their dropped copy, besides a 16 MiB
// backward scratch). The record's attention core is atty and one log-sum-exp per query row.
TEST(LongContext, ATrainingStepAtT2048StaysUnderWhatTheProbabilitiesAloneWouldTake) {
  constexpr int T = 2048, kHeads = 4;
  constexpr size_t kLimit = size_t{28} << 20;
  ASSERT_GT(sizeof(float) * kHeads * T * T, kLimit);
  for (Arch arch : {Arch::Gpt2, Arch::Llama}) {
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      SCOPED_TRACE(std::string(to_string(arch)) + ", recompute " + to_string(r));
      GPTConfig c;
      c.arch = arch;
      c.n_layer = 2;
      c.n_head = kHeads;
      if (arch == Arch::Llama) c.n_kv_head = 2, c.ffn_dim = 128;
      c.n_embd = 64;
      c.block_size = T;
      c.vocab_size = 64;
      c.dropout = 0.1f;
      GPTLayout layout;
      layout.recompute = r;
      Allocator alloc("long context", kLimit);
      GPT m(c, 1, alloc, layout);
      m.initialize(3);
      const std::vector<int32_t> tokens = random_tokens(c, T, 1), targets = random_tokens(c, T, 2);
      const double loss =
          m.forward(Batch{tokens.data(), targets.data(), 1, T}, StepContext{7, 1, true, 1.0f / T});
      m.backward();
      EXPECT_TRUE(std::isfinite(loss));
      EXPECT_EQ(m.first_non_finite(), "");
      EXPECT_LT(alloc.peak(), kLimit);
      EXPECT_NEAR(loss / T, std::log(64.0), 0.1);  // a freshly initialised model: about log V
    }
  }
}

// The attention record per mode: atty [B T, C / t] and the log-sum-exp [B, heads / t, T], fp32
// (bf16 GEMM inputs too: the fused backward's row term reads atty), kept (none) or in the
// workspace (selective, full); the backward's scratch one value per query row and head.
TEST(LongContext, TheAttentionRecordKeepsAttyAndTheLogSumExp) {
  const int B = 3, T = 40, t = 2;
  for (Arch arch : {Arch::Gpt2, Arch::Llama}) {
    GPTConfig c = arch == Arch::Llama ? llama(2, true) : gpt2(T);
    c.block_size = T;
    const int64_t tokens = int64_t{B} * T, heads = c.n_head / t, width = c.n_embd / t;
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      SCOPED_TRACE(std::string(to_string(arch)) + ", recompute " + to_string(r));
      auto tp = comm::placeholder_group(t, 0);
      auto ep = comm::placeholder_group(1, 0);
      ParameterSet ps;
      const Block blk(ps, c, 0, TensorSplit(*tp), ExpertSplit(*ep), r, nullptr, BlockPart::Whole,
                      true);
      Allocator alloc("records");
      const Block::Record rec = blk.make_record(B, alloc);
      const Block::Workspace ws = blk.make_workspace(B, alloc);
      const AttentionRecord& core = r == Recompute::None ? *rec.attention : *ws.attention;
      if (r != Recompute::None) {
        EXPECT_FALSE(rec.attention->atty.defined());
        EXPECT_FALSE(rec.attention->lse.defined());
      }
      EXPECT_EQ(core.atty.dtype(), DType::F32);
      EXPECT_EQ(core.atty.numel(), tokens * width);
      EXPECT_EQ(core.lse.dtype(), DType::F32);
      EXPECT_EQ(core.lse.numel(), tokens * heads);
      EXPECT_EQ(ws.delta.numel(), tokens * heads);
    }
  }
}

}  // namespace long_context
}  // namespace
}  // namespace tessera::nn
