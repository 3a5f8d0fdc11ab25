// An independent float64 GPT-2 for the tests: plain loops over Hugging Face GPT-2 semantics
// (LayerNorm eps, tanh GELU, causal attention scaled by 1/sqrt(head dim), tied head), sharing no
// code with the kernels. Dropout masks are drawn from the documented global coordinates:
//   keep = philox_uniform(seed, mix_stream(step, stable_hash(site)), index) > p
//   "drop", "h.<l>.attn.resid_dropout", "h.<l>.mlp.dropout": index ((s*T)+t)*C + c
//   "h.<l>.attn.attn_dropout": index ((s*NH + h)*T + t)*T + j
// An MoE block's MLP follows nn/moe_router.h: softmax router, top-k (ties to the lower index),
// renormalised gates, per-sequence capacity filled in (choice, position) order, and the
// auxiliary objective alpha loss_scale T sum_s balance_s + beta loss_scale sum_t lse_t^2.
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

  static RefModel from(const GPT& m) {
    RefModel r = from(m.config(), m.params());
    r.add(m.params(ParamGroup::Experts));
    return r;
  }
  static RefModel from(const GPTConfig& cfg, const ParameterSet& ps) {
    RefModel r;
    r.cfg = cfg;
    r.add(ps);
    return r;
  }
  void add(const ParameterSet& ps) {
    for (int i = 0; i < ps.size(); ++i) {
      const auto v = ps.param(i).to_vector();
      w[ps.infos()[i].name] = Vec(v.begin(), v.end());
    }
  }
};

struct RefBatch {
  std::vector<int32_t> tokens, targets;
  int B = 0, T = 0;
  int64_t first_sample = 0;
  uint64_t seed = 0, step = 0;
  float p = 0.0f;           // dropout probability in effect
  double loss_scale = 1.0;  // weight of the MoE auxiliary losses
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

inline double gelu(double v) {
  return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
}

// A GPT-2 MLP with the weights under prefix `h` ("h.3.mlp." or "h.3.mlp.experts.5.").
inline Vec mlp(const RefModel& m, const std::string& h, const Vec& a, int N) {
  const int C = m.cfg.n_embd;
  Vec f = conv1d(a, m.w.at(h + "c_fc.weight"), m.w.at(h + "c_fc.bias"), N, C, 4 * C);
  for (double& v : f) v = gelu(v);
  return conv1d(f, m.w.at(h + "c_proj.weight"), m.w.at(h + "c_proj.bias"), N, 4 * C, C);
}

// The mixture of experts of block l on a[N, C]; adds its auxiliary objective to *aux.
inline Vec moe(const RefModel& m, int l, const RefBatch& b, const Vec& a, double* aux) {
  const MoeConfig& q = m.cfg.moe;
  const int C = m.cfg.n_embd, E = q.experts, K = q.top_k, T = b.T, N = b.B * b.T;
  const std::string h = "h." + std::to_string(l) + ".mlp.";
  const Vec logits = conv1d(a, m.w.at(h + "router.weight"), Vec(E, 0.0), N, C, E);
  Vec p(static_cast<size_t>(N) * E), lse(N);
  std::vector<int> choice(static_cast<size_t>(N) * K);
  Vec gate(choice.size());
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int e = 0; e < E; ++e) mx = std::max(mx, logits[n * E + e]);
    for (int e = 0; e < E; ++e) z += std::exp(logits[n * E + e] - mx);
    for (int e = 0; e < E; ++e) p[n * E + e] = std::exp(logits[n * E + e] - mx) / z;
    lse[n] = mx + std::log(z);
    std::vector<bool> taken(E, false);
    double sum = 0;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || p[n * E + e] > p[n * E + best])) best = e;
      taken[best] = true;
      choice[n * K + j] = best;
      sum += p[n * E + best];
    }
    for (int j = 0; j < K; ++j) gate[n * K + j] = p[n * E + choice[n * K + j]] / sum;
  }
  // Capacity per sequence, first choices in position order, then second choices, ...
  std::vector<bool> kept(choice.size(), true);
  if (q.capacity_factor > 0) {
    const long cap =
        std::max(1L, static_cast<long>(std::ceil(q.capacity_factor * K * T / E - 1e-9)));
    for (int s = 0; s < b.B; ++s) {
      std::vector<long> used(E, 0);
      for (int j = 0; j < K; ++j)
        for (int t = 0; t < T; ++t) {
          const int a_idx = (s * T + t) * K + j;
          kept[a_idx] = used[choice[a_idx]] < cap;
          if (kept[a_idx]) ++used[choice[a_idx]];
        }
    }
  }
  Vec out(static_cast<size_t>(N) * C, 0.0);
  for (int e = 0; e < E; ++e) {
    const Vec y = mlp(m, h + "experts." + std::to_string(e) + ".", a, N);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < K; ++j)
        if (choice[n * K + j] == e && kept[n * K + j])
          for (int c = 0; c < C; ++c) out[n * C + c] += gate[n * K + j] * y[n * C + c];
  }
  if (aux) {
    double balance = 0, zsum = 0;
    for (int s = 0; s < b.B; ++s) {
      Vec f(E, 0.0), P(E, 0.0);
      for (int t = 0; t < T; ++t) {
        const int n = s * T + t;
        for (int j = 0; j < K; ++j) f[choice[n * K + j]] += 1.0 / (T * K);
        for (int e = 0; e < E; ++e) P[e] += p[n * E + e] / T;
        zsum += lse[n] * lse[n];
      }
      for (int e = 0; e < E; ++e) balance += E * f[e] * P[e];
    }
    *aux += q.aux_loss * b.loss_scale * T * balance + q.z_loss * b.loss_scale * zsum;
  }
  return out;
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

// Block l, in place: x = x + drop(attn(ln_1(x))); x = x + drop(mlp(ln_2(x))). An MoE block adds
// its auxiliary objective to *aux (when given).
inline void ref_block(const RefModel& m, int l, const RefBatch& b, Vec& x, double* aux = nullptr) {
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
  Vec pm = m.cfg.moe.is_moe_layer(l) ? moe(m, l, b, a2, aux) : mlp(m, h + "mlp.", a2, N);
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
inline double ref_loss_sum(const RefModel& m, const RefBatch& b, Vec* logits_out = nullptr,
                           double* aux = nullptr) {
  Vec x = ref_embedding(m, b);
  for (int l = 0; l < m.cfg.n_layer; ++l) ref_block(m, l, b, x, aux);
  return ref_head_loss_sum(m, b, x, logits_out);
}

}  // namespace tessera::nn::testing
