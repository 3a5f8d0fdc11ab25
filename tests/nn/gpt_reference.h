// An independent float64 GPT-2 for the tests: plain loops over Hugging Face GPT-2 semantics
// (LayerNorm eps, tanh GELU, causal attention scaled by 1/sqrt(head dim), tied head), sharing no
// code with the kernels. Dropout masks are drawn from the documented global coordinates:
//   keep = philox_uniform(seed, mix_stream(step, stable_hash(site)), index) > p
//   "drop", "h.<l>.attn.resid_dropout", "h.<l>.mlp.dropout": index ((s*T)+t)*C + c
//   "h.<l>.attn.attn_dropout": index ((s*NH + h)*T + t)*T + j
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "tessera/core/philox.h"
#include "tessera/nn/gpt.h"

namespace tessera::nn::testing {

using Vec = std::vector<double>;

struct RefModel {
  GPTConfig cfg;
  std::map<std::string, Vec> w;  // HF name -> values (HF layout)

  static RefModel from(const GPT& m) { return from(m.config(), m.params()); }
  static RefModel from(const GPTConfig& cfg, const ParameterSet& ps) {
    RefModel r;
    r.cfg = cfg;
    for (int i = 0; i < ps.size(); ++i) {
      const auto v = ps.param(i).to_vector();
      r.w[ps.infos()[i].name] = Vec(v.begin(), v.end());
    }
    return r;
  }
};

struct RefBatch {
  std::vector<int32_t> tokens, targets;
  int B = 0, T = 0;
  int64_t first_sample = 0;
  uint64_t seed = 0, step = 0;
  float p = 0.0f;  // dropout probability in effect
};

namespace detail {

inline bool keep(const RefBatch& b, const std::string& site, uint64_t index) {
  return philox_uniform(b.seed, mix_stream(b.step, stable_hash(site)), index) > b.p;
}

// Dropout on a [B, T, C] activation.
inline void drop_btc(Vec& x, const RefBatch& b, int C, const std::string& site) {
  if (b.p <= 0.0f) return;
  for (int i = 0; i < b.B; ++i)
    for (int t = 0; t < b.T; ++t)
      for (int c = 0; c < C; ++c) {
        const uint64_t idx = ((static_cast<uint64_t>(b.first_sample + i) * b.T) + t) * C + c;
        double& v = x[(static_cast<size_t>(i) * b.T + t) * C + c];
        v = keep(b, site, idx) ? v / (1.0 - b.p) : 0.0;
      }
}

inline Vec layernorm(const Vec& x, const Vec& g, const Vec& bias, int N, int C, double eps) {
  Vec y(x.size());
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + eps);
    for (int c = 0; c < C; ++c) y[n * C + c] = (x[n * C + c] - m) * s * g[c] + bias[c];
  }
  return y;
}

// Conv1D: y[N, out] = x[N, in] W[in, out] + b
inline Vec conv1d(const Vec& x, const Vec& W, const Vec& b, int N, int in, int out) {
  Vec y(static_cast<size_t>(N) * out);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < out; ++o) y[n * out + o] = b[o];
    for (int i = 0; i < in; ++i) {
      const double xi = x[n * in + i];
      for (int o = 0; o < out; ++o) y[n * out + o] += xi * W[i * out + o];
    }
  }
  return y;
}

}  // namespace detail

// The modules of the model, each on its own (tests of nn::Embedding, nn::Block, nn::Head).
// Embedding: x[B*T*C] = drop(wte[tokens] + wpe[t]).
inline Vec ref_embedding(const RefModel& m, const RefBatch& b) {
  using namespace detail;
  const int T = b.T, C = m.cfg.n_embd, N = b.B * b.T;
  const Vec& wte = m.w.at("wte.weight");
  const Vec& wpe = m.w.at("wpe.weight");
  Vec x(static_cast<size_t>(N) * C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) x[n * C + c] = wte[b.tokens[n] * C + c] + wpe[(n % T) * C + c];
  drop_btc(x, b, C, "drop");
  return x;
}

// Block l, in place: x = x + drop(attn(ln_1(x))); x = x + drop(mlp(ln_2(x))).
inline void ref_block(const RefModel& m, int l, const RefBatch& b, Vec& x) {
  using namespace detail;
  const int B = b.B, T = b.T, C = m.cfg.n_embd, NH = m.cfg.n_head, N = B * T;
  const double eps = m.cfg.ln_eps;
  const std::string h = "h." + std::to_string(l) + ".";
  auto W = [&](const std::string& s) -> const Vec& { return m.w.at(h + s); };
  const Vec a = layernorm(x, W("ln_1.weight"), W("ln_1.bias"), N, C, eps);
  const Vec qkv = conv1d(a, W("attn.c_attn.weight"), W("attn.c_attn.bias"), N, C, 3 * C);
  const Vec y = tessera::testing::causal_attention_ref(
      qkv, B, T, C, NH, b.first_sample, b.p,
      [&](uint64_t idx) { return keep(b, h + "attn.attn_dropout", idx); });
  Vec pr = conv1d(y, W("attn.c_proj.weight"), W("attn.c_proj.bias"), N, C, C);
  drop_btc(pr, b, C, h + "attn.resid_dropout");
  for (size_t i = 0; i < x.size(); ++i) x[i] += pr[i];
  const Vec a2 = layernorm(x, W("ln_2.weight"), W("ln_2.bias"), N, C, eps);
  Vec f = conv1d(a2, W("mlp.c_fc.weight"), W("mlp.c_fc.bias"), N, C, 4 * C);
  for (double& v : f)
    v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  Vec pm = conv1d(f, W("mlp.c_proj.weight"), W("mlp.c_proj.bias"), N, 4 * C, C);
  drop_btc(pm, b, C, h + "mlp.dropout");
  for (size_t i = 0; i < x.size(); ++i) x[i] += pm[i];
}

// Head: the sum of token cross-entropies of ln_f(x) . wte^T (targets -1 ignored).
inline double ref_head_loss_sum(const RefModel& m, const RefBatch& b, const Vec& x,
                                Vec* logits_out = nullptr) {
  using namespace detail;
  const int C = m.cfg.n_embd, V = m.cfg.vocab_size, N = b.B * b.T;
  const Vec& wte = m.w.at("wte.weight");
  const Vec xf = layernorm(x, m.w.at("ln_f.weight"), m.w.at("ln_f.bias"), N, C, m.cfg.ln_eps);
  double total = 0;
  Vec logits(V);
  if (logits_out) logits_out->assign(static_cast<size_t>(N) * V, 0.0);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      double d = 0;
      for (int c = 0; c < C; ++c) d += xf[n * C + c] * wte[v * C + c];
      logits[v] = d;
      mx = std::max(mx, d);
      if (logits_out) (*logits_out)[static_cast<size_t>(n) * V + v] = d;
    }
    if (b.targets.empty() || b.targets[n] < 0) continue;
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(logits[v] - mx);
    total += mx + std::log(z) - logits[b.targets[n]];
  }
  return total;
}

// Returns the sum of token cross-entropies (targets -1 ignored). Optional `logits_out`.
inline double ref_loss_sum(const RefModel& m, const RefBatch& b, Vec* logits_out = nullptr) {
  Vec x = ref_embedding(m, b);
  for (int l = 0; l < m.cfg.n_layer; ++l) ref_block(m, l, b, x);
  return ref_head_loss_sum(m, b, x, logits_out);
}

}  // namespace tessera::nn::testing
