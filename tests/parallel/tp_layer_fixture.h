// The tensor- and sequence-parallel layer tests' fixtures: tiny configs and data, running a module
// on t thread ranks, and comparing each rank's shards with one device's full tensors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/tensor_parallel.h"

namespace tessera::nn {

// A parameter's values or gradient in its global shape; NaN where this rank holds nothing.
using Globals = std::map<std::string, std::vector<float>>;

inline Globals expand(const ParameterSet& ps, bool grads) {
  Globals out;
  for (int i = 0; i < ps.size(); ++i) {
    const ParamInfo& info = ps.infos()[i];
    std::vector<float> g(static_cast<size_t>(info.global_numel()), NAN);
    const float* local = grads ? ps.grad_data(i) : ps.param_data(i);
    for (int64_t j = 0; j < info.local_numel(); ++j) g[info.global_index(j)] = local[j];
    out[info.name] = std::move(g);
  }
  return out;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// Every element some rank holds equals the full tensor's within rel * max|full|, and every element
// of the full tensor is held by at least one rank.
inline void expect_shards_match(const Globals& full, const std::vector<Globals>& ranks, double rel,
                                const std::string& what) {
  for (const auto& [name, f] : full) {
    const double tol = rel * std::max(max_abs(f), 1e-6);
    std::vector<int> held(f.size(), 0);
    for (size_t r = 0; r < ranks.size(); ++r) {
      const std::vector<float>& g = ranks[r].at(name);
      ASSERT_EQ(g.size(), f.size()) << name;
      for (size_t i = 0; i < f.size(); ++i) {
        if (std::isnan(g[i])) continue;
        ++held[i];
        ASSERT_NEAR(g[i], f[i], tol) << what << " " << name << "[" << i << "] on tp rank " << r;
      }
    }
    for (size_t i = 0; i < f.size(); ++i)
      ASSERT_GT(held[i], 0) << what << " " << name << "[" << i << "] is held by no rank";
  }
}

inline void expect_near_all(const std::vector<float>& a, const std::vector<float>& b, double rel,
                            const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  const double tol = rel * std::max(max_abs(a), 1e-6);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], tol) << what << "[" << i << "]";
}

inline GPTConfig config(int heads, int C, int V, float dropout) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = heads;
  c.n_embd = C;
  c.block_size = 8;
  c.vocab_size = V;
  c.dropout = dropout;
  return c;
}

struct Data {
  int B = 3, T = 8;
  std::vector<int32_t> tokens, targets;
  std::vector<float> x, dy;  // a hidden state and an output gradient [B, T, C]
  Batch batch() const { return Batch{tokens.data(), targets.data(), B, T, 5}; }
};

// B = 3 sequences of T <= block_size tokens.
inline Data make_data(const GPTConfig& c, uint32_t seed, int T = 8) {
  Data d;
  d.T = T;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int i = 0; i < d.B * d.T; ++i) {
    d.tokens.push_back(tok(rng));
    d.targets.push_back(i % 7 == 3 ? -1 : tok(rng));
  }
  for (int i = 0; i < d.B * d.T * c.n_embd; ++i) {
    d.x.push_back(n(rng));
    d.dy.push_back(n(rng));
  }
  return d;
}

inline const StepContext kCtx{1234, 7, true, 1.0f / 20.0f};

// What one rank of a module test produces.
struct RankOut {
  std::vector<float> out, dx;  // the module's output and input gradient (replicated)
  double loss = 0;
  Globals grads, values;
};

// Runs `body` on t thread ranks (t == 1: a group of one) and collects each rank's result.
// sequence: the split is sequence-parallel.
template <typename Body>
std::vector<RankOut> on_ranks(int t, Body body, bool sequence = false) {
  std::vector<RankOut> outs(static_cast<size_t>(t));
  comm::run_inproc(t, [&](comm::Communicator& c) {
    Allocator alloc("tp rank " + std::to_string(c.rank()));
    CurrentAllocatorScope scope(alloc);
    TensorSplit split{c, sequence};
    outs[static_cast<size_t>(c.rank())] = body(split, alloc);
  });
  return outs;
}

}  // namespace tessera::nn
