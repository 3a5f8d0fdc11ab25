// Helpers shared by the module tests: random batches, and gradients checked against central
// differences of a float64 reference function.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpt_reference.h"

namespace tessera::nn::testing {

// Tokens and targets drawn from `seed`; every fifth target (position 2 mod 5) is -1 (ignored)
// unless all_targets.
inline RefBatch make_batch(const GPTConfig& c, int B, int T, uint32_t seed, float p, int64_t first,
                           bool all_targets = false) {
  RefBatch b;
  b.B = B;
  b.T = T;
  b.seed = 77;
  b.step = 3;
  b.p = p;
  b.first_sample = first;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(tok(rng));
    b.targets.push_back(!all_targets && i % 5 == 2 ? -1 : tok(rng));
  }
  return b;
}

inline Batch as_batch(const RefBatch& r) {
  return Batch{r.tokens.data(), r.targets.data(), r.B, r.T, r.first_sample};
}
inline StepContext ctx_of(const RefBatch& r, float scale) {
  return StepContext{r.seed, r.step, true, scale};
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// |got - ref| <= 1e-4 (|ref| + 0.01 max|ref|) element-wise, where ref[j] is the central difference
// of the float64 function f with respect to x[j] (x is perturbed in place and restored).
inline void expect_gradient(const std::string& what, const std::vector<float>& got, Vec& x,
                            const std::function<double()>& f) {
  ASSERT_EQ(got.size(), x.size()) << what;
  Vec ref(x.size());
  const double h = 1e-6;
  for (size_t j = 0; j < x.size(); ++j) {
    const double saved = x[j];
    x[j] = saved + h;
    const double lp = f();
    x[j] = saved - h;
    const double lm = f();
    x[j] = saved;
    ref[j] = (lp - lm) / (2 * h);
  }
  double rmax = 0;
  for (double v : ref) rmax = std::max(rmax, std::abs(v));
  for (size_t j = 0; j < x.size(); ++j) {
    const double denom = std::abs(ref[j]) + 0.01 * rmax;
    ASSERT_LE(std::abs(got[j] - ref[j]), 1e-4 * (denom > 0 ? denom : 1.0))
        << what << "[" << j << "]: " << got[j] << " vs reference " << ref[j];
  }
}

}  // namespace tessera::nn::testing
