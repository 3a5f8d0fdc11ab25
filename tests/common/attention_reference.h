// The tests' float64 causal self-attention (plain loops, sharing no code with the kernels), used
// by the attention kernel's test and by the reference GPT-2. qkv is [B, T, 3C] (q, k, v), the
// result [B, T, C]. With p > 0, attention probabilities are dropped where keep(index) is false
// and the rest scaled by 1/(1-p), index = ((first_sample + b) * NH + h) * T + t) * T + j as the
// kernels document.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tessera::testing {

template <typename In, typename Keep>
std::vector<double> causal_attention_ref(const std::vector<In>& qkv, int B, int T, int C, int NH,
                                         uint64_t first_sample, double p, Keep keep) {
  const int hs = C / NH;
  std::vector<double> out(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hs; ++i)
            d += static_cast<double>(qkv[(b * T + t) * 3 * C + h * hs + i]) *
                 qkv[(b * T + j) * 3 * C + C + h * hs + i];
          s[j] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= t; ++j) {
          double pj = s[j] / z;
          if (p > 0) {
            const uint64_t idx =
                ((static_cast<uint64_t>(first_sample + b) * NH + h) * T + t) * T + j;
            pj = keep(idx) ? pj / (1.0 - p) : 0.0;
          }
          for (int i = 0; i < hs; ++i)
            out[(b * T + t) * C + h * hs + i] += pj * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + i];
        }
      }
  return out;
}

}  // namespace tessera::testing
