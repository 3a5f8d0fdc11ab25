// Matmul efficiency by shape: the share of the peak a row-major C[M, N] = A[M, K] B[K, N] reaches,
// measured on a grid of (M, N, K) (`tessera plan --calibrate`: one BLAS thread, thread CPU time)
// and interpolated between its points. A cluster without a grid uses its one matmul_efficiency.
//
// JSON (the cluster's "gemm_efficiency"): {"dims": [16, 32, ...], "efficiency": e} with
// e[i][j][k] the efficiency at M = dims[i], N = dims[j], K = dims[k]; dims ascending, each > 0.
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
  GemmEfficiency(std::vector<double> dims, std::vector<double> values);

  bool empty() const { return dims_.empty(); }
  const std::vector<double>& dims() const { return dims_; }
  const std::vector<double>& values() const { return values_; }
  double at_grid(size_t i, size_t j, size_t k) const;

  // Trilinear in log2 of each dimension; a dimension outside the grid takes its nearest edge.
  double at(double M, double N, double K) const;

  bool operator==(const GemmEfficiency& o) const {
    return dims_ == o.dims_ && values_ == o.values_;
  }

 private:
  std::vector<double> dims_, values_;
};

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
