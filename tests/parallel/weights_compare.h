// Reading a run's saved weights and comparing two runs' weights tensor by tensor (shared by the
// data- and tensor-parallel equivalence tests).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tessera/io/safetensors.h"

namespace tessera::train::testing {

inline std::map<std::string, std::vector<float>> read_weights(const std::filesystem::path& file) {
  io::SafetensorsFile f(file);
  std::map<std::string, std::vector<float>> out;
  for (const std::string& n : f.names()) {
    std::vector<float> v(f.info(n).numel());
    f.read_f32(n, v.data(), static_cast<int64_t>(v.size()));
    out[n] = std::move(v);
  }
  return out;
}

// Per tensor: ||b - a|| <= rel * ||a|| (2-norm), the usual relative error of a tensor;
// expert_rel (when > 0) instead for the experts of a mixture of experts ("*.mlp.experts.*", and
// Mixtral's "*.block_sparse_moe.experts.*").
inline void expect_same_weights(const std::map<std::string, std::vector<float>>& a,
                                const std::map<std::string, std::vector<float>>& b, double rel,
                                double expert_rel = 0) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, va] : a) {
    const std::vector<float>& vb = b.at(name);
    ASSERT_EQ(va.size(), vb.size()) << name;
    // The key bias (the middle third of c_attn.bias) has a gradient that is exactly zero in exact
    // arithmetic: adding a constant to every key's dot product with a query does not change the
    // softmax. In fp32 it receives rounding noise (~1e-9, below AdamW's eps), which AdamW turns
    // into steps, so its values depend on summation order in any layout, even on the number of
    // micro-batches of one rank. It is checked to stay negligible instead.
    const bool key_bias = name.ends_with("attn.c_attn.bias");
    const size_t C = va.size() / 3;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < va.size(); ++i) {
      if (key_bias && i >= C && i < 2 * C) {
        EXPECT_LT(std::abs(vb[i]), 1e-3) << name << "[" << i << "]";
        continue;
      }
      diff += (static_cast<double>(vb[i]) - va[i]) * (static_cast<double>(vb[i]) - va[i]);
      norm += static_cast<double>(va[i]) * va[i];
    }
    const bool expert =
        expert_rel > 0 && (name.find(".mlp.experts.") != std::string::npos ||
                           name.find(".block_sparse_moe.experts.") != std::string::npos);
    // A rotary model's key bias (Qwen2's self_attn.k_proj.bias) is rotated with its key, so its
    // gradient is not zero, but it is what is left of the zero above: only q . (R(j - i) b)
    // varies over the keys j, and at small angles little does. Its gradients are small and AdamW
    // amplifies their rounding as above: 1e-3 relative.
    const double bound = name.ends_with("self_attn.k_proj.bias") ? std::max(rel, 1e-3)
                         : expert                                ? expert_rel
                                                                 : rel;
    EXPECT_LE(std::sqrt(diff), bound * std::sqrt(norm)) << name;
  }
}

}  // namespace tessera::train::testing
