#include "tessera/nn/moe_router.h"

#include <cmath>
#include <vector>

#include "tessera/core/error.h"

namespace tessera::nn {

void router_softmax(float* probs, float* lse, const float* logits, int64_t N, int E) {
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    float m = l[0];
    for (int e = 1; e < E; ++e) m = std::max(m, l[e]);
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(static_cast<double>(l[e] - m));
    for (int e = 0; e < E; ++e)
      p[e] = static_cast<float>(std::exp(static_cast<double>(l[e] - m)) / s);
    lse[n] = static_cast<float>(m + std::log(s));
  }
}

void router_sigmoid(float* scores, float* probs, float* lse, const float* logits, int64_t N,
                    int E) {
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * E;
    float* s = scores + n * E;
    float m = l[0];
    for (int e = 1; e < E; ++e) m = std::max(m, l[e]);
    double z = 0, sum = 0;
    for (int e = 0; e < E; ++e) {
      z += std::exp(static_cast<double>(l[e] - m));
      s[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
      sum += s[e];
    }
    for (int e = 0; e < E; ++e) probs[n * E + e] = static_cast<float>(s[e] / sum);
    lse[n] = static_cast<float>(m + std::log(z));
  }
}

void router_top_k(int32_t* expert, float* gate, const float* scores, int64_t N, int E, int k,
                  const float* bias, bool renormalize) {
  TESSERA_ASSERT(k >= 1 && k <= E, "router_top_k: k = ", k, " with ", E, " experts");
  std::vector<uint8_t> taken(static_cast<size_t>(E));
  std::vector<float> biased(bias ? static_cast<size_t>(E) : 0);
  for (int64_t n = 0; n < N; ++n) {
    const float* p = scores + n * E;
    const float* sel = p;  // what the selection compares
    if (bias) {
      for (int e = 0; e < E; ++e) biased[e] = p[e] + bias[e];
      sel = biased.data();
    }
    int32_t* ex = expert + n * k;
    std::fill(taken.begin(), taken.end(), uint8_t{0});
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)  // strictly greater: the lower index wins a tie
        if (!taken[e] && (best < 0 || sel[e] > sel[best])) best = e;
      taken[best] = 1;
      ex[j] = best;
      sum += p[best];
    }
    for (int j = 0; j < k; ++j)
      gate[n * k + j] = renormalize ? static_cast<float>(p[ex[j]] / sum) : p[ex[j]];
  }
}

int64_t expert_capacity(const MoeConfig& m, int T) {
  if (m.capacity_factor <= 0.0f) return 0;
  const double c = static_cast<double>(m.capacity_factor) * m.top_k * T / m.experts;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(c - 1e-9)));
}

int64_t router_capacity(uint8_t* kept, const int32_t* expert, int B, int T, int E, int k,
                        int64_t capacity) {
  int64_t dropped = 0;
  std::vector<int64_t> used(static_cast<size_t>(E));
  for (int b = 0; b < B; ++b) {
    std::fill(used.begin(), used.end(), 0);
    for (int j = 0; j < k; ++j)
      for (int t = 0; t < T; ++t) {
        const int64_t a = (static_cast<int64_t>(b) * T + t) * k + j;
        const int e = expert[a];
        const bool fits = capacity == 0 || used[e] < capacity;
        kept[a] = fits ? 1 : 0;
        if (fits)
          ++used[e];
        else
          ++dropped;
      }
  }
  return dropped;
}

namespace {
// f_si * T * k: the router's choices of expert i in sequence b (the given counts of the whole
// sequence under context parallelism, else this rank's).
void choice_counts(std::vector<double>& counts, const int32_t* expert, int b, int T, int k,
                   const double* given) {
  if (given) {
    const double* g = given + static_cast<int64_t>(b) * counts.size();
    std::copy(g, g + counts.size(), counts.begin());
    return;
  }
  std::fill(counts.begin(), counts.end(), 0.0);
  const int32_t* ex = expert + static_cast<int64_t>(b) * T * k;
  for (int64_t a = 0; a < static_cast<int64_t>(T) * k; ++a) counts[ex[a]] += 1.0;
}
}  // namespace

RouterLossSums router_loss_sums(const float* probs, const float* lse, const int32_t* expert, int B,
                                int T, int E, int k, const double* given, int seq_len) {
  const double L = seq_len > 0 ? seq_len : T;  // the sequence's length
  RouterLossSums s;
  std::vector<double> counts(static_cast<size_t>(E)), psum(static_cast<size_t>(E));
  for (int b = 0; b < B; ++b) {
    choice_counts(counts, expert, b, T, k, given);
    std::fill(psum.begin(), psum.end(), 0.0);
    for (int t = 0; t < T; ++t) {
      const int64_t n = static_cast<int64_t>(b) * T + t;
      for (int e = 0; e < E; ++e) psum[e] += probs[n * E + e];
      s.z += static_cast<double>(lse[n]) * lse[n];
    }
    double bal = 0;
    for (int e = 0; e < E; ++e) bal += counts[e] / (L * k) * (psum[e] / L);
    s.balance += E * bal;
  }
  return s;
}

namespace {
// dL/dscore of token n's chosen experts through its gates, added to ds: renormalised
// g_j = s_{e_j} / S gives dL/ds_m = (dg_m - sum_j dg_j g_j) / S, plain g_j = s_{e_j} gives dg_m.
void gate_backward(double* ds, const float* s, const float* dgate, const int32_t* expert,
                   const float* gate, int64_t n, int k, bool renormalize) {
  if (!renormalize) {
    for (int j = 0; j < k; ++j) ds[expert[n * k + j]] += dgate[n * k + j];
    return;
  }
  double S = 0, a = 0;
  for (int j = 0; j < k; ++j) {
    S += s[expert[n * k + j]];
    a += static_cast<double>(dgate[n * k + j]) * gate[n * k + j];
  }
  for (int j = 0; j < k; ++j) ds[expert[n * k + j]] += (dgate[n * k + j] - a) / S;
}
}  // namespace

void router_backward(float* dlogits, const float* dgate, const float* probs, const float* lse,
                     const int32_t* expert, const float* gate, int B, int T, int E, int k,
                     float balance_weight, float z_weight, bool renormalize, const double* given,
                     int seq_len) {
  const double L = seq_len > 0 ? seq_len : T;
  std::vector<double> counts(static_cast<size_t>(E)), dp(static_cast<size_t>(E));
  for (int b = 0; b < B; ++b) {
    choice_counts(counts, expert, b, T, k, given);
    for (int t = 0; t < T; ++t) {
      const int64_t n = static_cast<int64_t>(b) * T + t;
      const float* p = probs + n * E;
      // The balance loss: d/dp_ti of balance_weight T E sum_i f_si P_si = balance_weight E f_si.
      for (int e = 0; e < E; ++e) dp[e] = balance_weight * E * counts[e] / (L * k);
      // Through the gates.
      gate_backward(dp.data(), p, dgate, expert, gate, n, k, renormalize);
      // Softmax backward, plus the z-loss: d(z_weight lse^2)/dlogit_i = 2 z_weight lse p_i.
      double dot = 0;
      for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
      const double zg = 2.0 * z_weight * lse[n];
      for (int e = 0; e < E; ++e)
        dlogits[n * E + e] = static_cast<float>(p[e] * (dp[e] - dot + zg));
    }
  }
}

void router_backward_sigmoid(float* dlogits, const float* dgate, const float* scores,
                             const float* probs, const float* lse, const float* logits,
                             const int32_t* expert, const float* gate, int B, int T, int E, int k,
                             float balance_weight, float z_weight, bool renormalize,
                             const double* given, int seq_len) {
  const double L = seq_len > 0 ? seq_len : T;
  std::vector<double> counts(static_cast<size_t>(E)), ds(static_cast<size_t>(E));
  for (int b = 0; b < B; ++b) {
    choice_counts(counts, expert, b, T, k, given);
    for (int t = 0; t < T; ++t) {
      const int64_t n = static_cast<int64_t>(b) * T + t;
      const float* s = scores + n * E;
      const float* p = probs + n * E;
      // The balance loss reads p = s / sum s: dL/ds_m = (dL/dp_m - sum_i dL/dp_i p_i) / sum s.
      double sum = 0, dot = 0;
      for (int e = 0; e < E; ++e) {
        sum += s[e];
        dot += balance_weight * E * counts[e] / (L * k) * p[e];
      }
      for (int e = 0; e < E; ++e) ds[e] = (balance_weight * E * counts[e] / (L * k) - dot) / sum;
      gate_backward(ds.data(), s, dgate, expert, gate, n, k, renormalize);
      // sigmoid' = s (1 - s); the z-loss through lse: 2 z_weight lse softmax(logits).
      const double zg = 2.0 * z_weight * lse[n];
      for (int e = 0; e < E; ++e) {
        const double q = std::exp(static_cast<double>(logits[n * E + e]) - lse[n]);
        dlogits[n * E + e] = static_cast<float>(ds[e] * s[e] * (1.0 - s[e]) + zg * q);
      }
    }
  }
}

}  // namespace tessera::nn
