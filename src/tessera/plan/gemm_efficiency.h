// Matmul efficiency by shape: the share of the peak a row-major C[M, N] = A[M, K] B[K, N] reaches,
// measured on a grid of (M, N, K) (`tessera plan --calibrate`: one BLAS thread, thread CPU time)
// and interpolated between its points. A cluster without a grid uses its one matmul_efficiency.
//
// Two grids: operands in the core's cache (each GEMM repeated on the same buffers) and operands
// from beyond it (the next buffers of a larger pool each call). A GEMM whose operands (4 (MK + KN +
// MN) bytes) fit in half of `cache_bytes` takes the first, one above twice it the second, and a
// blend (linear in log2 of the bytes) between.
//
// JSON (the cluster's "gemm_efficiency"): {"dims": [16, 32, ...], "efficiency": e,
// "efficiency_cold": e2, "cache_bytes": n} with e[i][j][k] the efficiency at M = dims[i], N =
// dims[j], K = dims[k]; dims ascending, each > 0; without "efficiency_cold", e for every size.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace tessera::plan {

class GemmEfficiency {
 public:
  GemmEfficiency() = default;
  // `values` has dims.size()^3 entries, index (i * n + j) * n + k for (M, N, K) = dims (i, j, k).
  GemmEfficiency(std::vector<double> dims, std::vector<double> values,
                 std::vector<double> cold = {}, double cache_bytes = 0);

  bool empty() const { return dims_.empty(); }
  const std::vector<double>& dims() const { return dims_; }
  const std::vector<double>& values() const { return values_; }
  const std::vector<double>& cold_values() const { return cold_; }
  double cache_bytes() const { return cache_bytes_; }
  double at_grid(size_t i, size_t j, size_t k, bool cold = false) const;

  // Trilinear in log2 of each dimension; a dimension outside the grid takes its nearest edge.
  double at(double M, double N, double K) const;

  bool operator==(const GemmEfficiency& o) const {
    return dims_ == o.dims_ && values_ == o.values_ && cold_ == o.cold_ &&
           cache_bytes_ == o.cache_bytes_;
  }

 private:
  double interpolate(double M, double N, double K, bool cold) const;
  std::vector<double> dims_, values_, cold_;
  double cache_bytes_ = 0;
};

// tessera's attention kernel (the fused one, kernels/flash_attention.cc: per (sequence, head),
// tiles of 64 queries against 64 keys, the online softmax between the GEMMs; the backward reruns
// Q K^T) by context T and head size: the FLOPs plan/work.h counts over the kernel's time, over the
// peak, forward and backward. Measured, since the per-head GEMMs are small and strided and the
// softmax runs between them; bilinear in log2, clamped at the edges. (Tables measured before the
// fused kernel timed the materialising one, kernels/attention.cc.)
// JSON: {"seq": [...], "head_size": [...], "forward": f, "backward": b}, f[i][j] at seq[i],
// head_size[j].
struct AttentionEfficiency {
  std::vector<double> seq, head_size;
  std::vector<double> forward, backward;  // seq.size() x head_size.size(), row-major
  bool empty() const { return seq.empty(); }
  double at(bool backward_pass, double T, double hs) const;
  bool operator==(const AttentionEfficiency& o) const {
    return seq == o.seq && head_size == o.head_size && forward == o.forward &&
           backward == o.backward;
  }
};
AttentionEfficiency attention_efficiency_from_json(const nlohmann::json& j,
                                                   const std::string& source);
nlohmann::json to_json(const AttentionEfficiency& a);

// ConfigError naming `source` on a malformed table.
GemmEfficiency gemm_efficiency_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json to_json(const GemmEfficiency& g);

// Lookups of one table, cached per (M, N, K): a ranking asks for the same shapes many times.
class GemmEfficiencyCache {
 public:
  GemmEfficiencyCache() = default;
  explicit GemmEfficiencyCache(GemmEfficiency table) : table_(std::move(table)) {}
  const GemmEfficiency& table() const { return table_; }
  double operator()(double M, double N, double K) const;

 private:
  GemmEfficiency table_;
  mutable std::map<std::array<double, 3>, double> cache_;
};

}  // namespace tessera::plan
