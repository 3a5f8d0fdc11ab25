#include "tessera/plan/gemm_efficiency.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"

namespace tessera::plan {

GemmEfficiency::GemmEfficiency(std::vector<double> dims, std::vector<double> values)
    : dims_(std::move(dims)), values_(std::move(values)) {
  const size_t n = dims_.size();
  TESSERA_CHECK_AS(ConfigError, values_.size() == n * n * n, "gemm efficiency: ", n, " dims need ",
                   n * n * n, " values, got ", values_.size());
  for (size_t i = 0; i < n; ++i)
    TESSERA_CHECK_AS(ConfigError, dims_[i] > 0 && (i == 0 || dims_[i] > dims_[i - 1]),
                     "gemm efficiency: dims must be positive and ascending");
  for (double v : values_)
    TESSERA_CHECK_AS(ConfigError, v > 0 && v <= 2,
                     "gemm efficiency: values must be in (0, 2], got ", v);
}

double GemmEfficiency::at_grid(size_t i, size_t j, size_t k) const {
  const size_t n = dims_.size();
  return values_[(i * n + j) * n + k];
}

namespace {

// The grid cell [lo, lo + 1] holding log2(x) and the weight of lo + 1; clamped to the edges.
std::pair<size_t, double> locate(const std::vector<double>& dims, double x) {
  if (dims.size() == 1 || x <= dims.front()) return {0, 0.0};
  if (x >= dims.back()) return {dims.size() - 2, 1.0};
  const size_t hi =
      static_cast<size_t>(std::upper_bound(dims.begin(), dims.end(), x) - dims.begin());
  const double a = std::log2(dims[hi - 1]), b = std::log2(dims[hi]);
  return {hi - 1, (std::log2(x) - a) / (b - a)};
}

}  // namespace

double GemmEfficiency::at(double M, double N, double K) const {
  TESSERA_ASSERT(!empty(), "gemm efficiency: an empty table has no values");
  if (dims_.size() == 1) return values_.front();
  const auto [i, wi] = locate(dims_, M);
  const auto [j, wj] = locate(dims_, N);
  const auto [k, wk] = locate(dims_, K);
  double sum = 0;
  for (size_t di = 0; di < 2; ++di)
    for (size_t dj = 0; dj < 2; ++dj)
      for (size_t dk = 0; dk < 2; ++dk) {
        const double w = (di ? wi : 1 - wi) * (dj ? wj : 1 - wj) * (dk ? wk : 1 - wk);
        if (w > 0) sum += w * at_grid(i + di, j + dj, k + dk);
      }
  return sum;
}

GemmEfficiency gemm_efficiency_from_json(const nlohmann::json& j, const std::string& source) {
  const std::string where = source + " (gemm_efficiency)";
  TESSERA_CHECK_AS(ConfigError, j.is_object() && j.contains("dims") && j.contains("efficiency"),
                   where, ": needs 'dims' and 'efficiency'");
  const nlohmann::json& d = j.at("dims");
  const nlohmann::json& e = j.at("efficiency");
  TESSERA_CHECK_AS(ConfigError, d.is_array() && !d.empty(), where,
                   ": 'dims' must be a non-empty array");
  const size_t n = d.size();
  std::vector<double> dims, values;
  for (const nlohmann::json& x : d) {
    TESSERA_CHECK_AS(ConfigError, x.is_number(), where, ": 'dims' must be numbers");
    dims.push_back(x.get<double>());
  }
  auto rows = [&](const nlohmann::json& a) {
    TESSERA_CHECK_AS(ConfigError, a.is_array() && a.size() == n, where,
                     ": 'efficiency' must be nested arrays of ", n, " x ", n, " x ", n);
  };
  rows(e);
  for (const nlohmann::json& plane : e) {
    rows(plane);
    for (const nlohmann::json& row : plane) {
      rows(row);
      for (const nlohmann::json& v : row) {
        TESSERA_CHECK_AS(ConfigError, v.is_number(), where, ": efficiencies must be numbers");
        values.push_back(v.get<double>());
      }
    }
  }
  try {
    return GemmEfficiency(std::move(dims), std::move(values));
  } catch (const ConfigError& err) {
    throw ConfigError(detail::concat(where, ": ", err.what()));
  }
}

nlohmann::json to_json(const GemmEfficiency& g) {
  const size_t n = g.dims().size();
  nlohmann::json e = nlohmann::json::array();
  for (size_t i = 0; i < n; ++i) {
    nlohmann::json plane = nlohmann::json::array();
    for (size_t j = 0; j < n; ++j) {
      nlohmann::json row = nlohmann::json::array();
      for (size_t k = 0; k < n; ++k) row.push_back(g.at_grid(i, j, k));
      plane.push_back(row);
    }
    e.push_back(plane);
  }
  return {{"dims", g.dims()}, {"efficiency", e}};
}

double GemmEfficiencyCache::operator()(double M, double N, double K) const {
  TESSERA_ASSERT(!table_.empty(), "gemm efficiency: no table");
  const std::array<double, 3> key{M, N, K};
  auto it = cache_.find(key);
  if (it == cache_.end()) it = cache_.emplace(key, table_.at(M, N, K)).first;
  return it->second;
}

}  // namespace tessera::plan
