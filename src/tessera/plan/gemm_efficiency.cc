#include "tessera/plan/gemm_efficiency.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"

namespace tessera::plan {

GemmEfficiency::GemmEfficiency(std::vector<double> dims, std::vector<double> values,
                               std::vector<double> cold, double cache_bytes)
    : dims_(std::move(dims)),
      values_(std::move(values)),
      cold_(std::move(cold)),
      cache_bytes_(cache_bytes) {
  const size_t n = dims_.size();
  TESSERA_CHECK_AS(ConfigError, values_.size() == n * n * n, "gemm efficiency: ", n, " dims need ",
                   n * n * n, " values, got ", values_.size());
  TESSERA_CHECK_AS(ConfigError,
                   cold_.empty() || (cold_.size() == values_.size() && cache_bytes_ > 0),
                   "gemm efficiency: the cold grid needs as many values and a positive cache size");
  for (size_t i = 0; i < n; ++i)
    TESSERA_CHECK_AS(ConfigError, dims_[i] > 0 && (i == 0 || dims_[i] > dims_[i - 1]),
                     "gemm efficiency: dims must be positive and ascending");
  for (const std::vector<double>* grid : {&values_, &cold_})
    for (double v : *grid)
      TESSERA_CHECK_AS(ConfigError, v > 0 && v <= 2,
                       "gemm efficiency: values must be in (0, 2], got ", v);
}

double GemmEfficiency::at_grid(size_t i, size_t j, size_t k, bool cold) const {
  const size_t n = dims_.size();
  return (cold ? cold_ : values_)[(i * n + j) * n + k];
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

double GemmEfficiency::interpolate(double M, double N, double K, bool cold) const {
  if (dims_.size() == 1) return at_grid(0, 0, 0, cold);
  const auto [i, wi] = locate(dims_, M);
  const auto [j, wj] = locate(dims_, N);
  const auto [k, wk] = locate(dims_, K);
  double sum = 0;
  for (size_t di = 0; di < 2; ++di)
    for (size_t dj = 0; dj < 2; ++dj)
      for (size_t dk = 0; dk < 2; ++dk) {
        const double w = (di ? wi : 1 - wi) * (dj ? wj : 1 - wj) * (dk ? wk : 1 - wk);
        if (w > 0) sum += w * at_grid(i + di, j + dj, k + dk, cold);
      }
  return sum;
}

double GemmEfficiency::at(double M, double N, double K) const {
  TESSERA_ASSERT(!empty(), "gemm efficiency: an empty table has no values");
  const double hot = interpolate(M, N, K, false);
  if (cold_.empty()) return hot;
  const double bytes = 4 * (M * K + K * N + M * N);
  const double w = std::clamp((std::log2(bytes / cache_bytes_) + 1) / 2, 0.0, 1.0);
  return w == 0 ? hot : (1 - w) * hot + w * interpolate(M, N, K, true);
}

namespace {

// A dims^3 nested array of numbers, flattened in (i, j, k) order.
std::vector<double> cube(const nlohmann::json& e, size_t n, const std::string& where) {
  auto rows = [&](const nlohmann::json& a) {
    TESSERA_CHECK_AS(ConfigError, a.is_array() && a.size() == n, where,
                     ": efficiencies must be nested arrays of ", n, " x ", n, " x ", n);
  };
  std::vector<double> values;
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
  return values;
}

nlohmann::json nested(const GemmEfficiency& g, bool cold) {
  const size_t n = g.dims().size();
  nlohmann::json e = nlohmann::json::array();
  for (size_t i = 0; i < n; ++i) {
    nlohmann::json plane = nlohmann::json::array();
    for (size_t j = 0; j < n; ++j) {
      nlohmann::json row = nlohmann::json::array();
      for (size_t k = 0; k < n; ++k) row.push_back(g.at_grid(i, j, k, cold));
      plane.push_back(row);
    }
    e.push_back(plane);
  }
  return e;
}

}  // namespace

GemmEfficiency gemm_efficiency_from_json(const nlohmann::json& j, const std::string& source) {
  const std::string where = source + " (gemm_efficiency)";
  TESSERA_CHECK_AS(ConfigError, j.is_object() && j.contains("dims") && j.contains("efficiency"),
                   where, ": needs 'dims' and 'efficiency'");
  const nlohmann::json& d = j.at("dims");
  TESSERA_CHECK_AS(ConfigError, d.is_array() && !d.empty(), where,
                   ": 'dims' must be a non-empty array");
  std::vector<double> dims;
  for (const nlohmann::json& x : d) {
    TESSERA_CHECK_AS(ConfigError, x.is_number(), where, ": 'dims' must be numbers");
    dims.push_back(x.get<double>());
  }
  std::vector<double> hot = cube(j.at("efficiency"), dims.size(), where), cold;
  double cache = 0;
  if (j.contains("efficiency_cold")) {
    cold = cube(j.at("efficiency_cold"), dims.size(), where);
    TESSERA_CHECK_AS(ConfigError, j.contains("cache_bytes") && j.at("cache_bytes").is_number(),
                     where, ": 'efficiency_cold' needs 'cache_bytes'");
    cache = j.at("cache_bytes").get<double>();
  }
  try {
    return GemmEfficiency(std::move(dims), std::move(hot), std::move(cold), cache);
  } catch (const ConfigError& err) {
    throw ConfigError(detail::concat(where, ": ", err.what()));
  }
}

nlohmann::json to_json(const GemmEfficiency& g) {
  nlohmann::json j = {{"dims", g.dims()}, {"efficiency", nested(g, false)}};
  if (!g.cold_values().empty()) {
    j["efficiency_cold"] = nested(g, true);
    j["cache_bytes"] = g.cache_bytes();
  }
  return j;
}

double AttentionEfficiency::at(bool backward_pass, double T, double hs) const {
  TESSERA_ASSERT(!empty(), "attention efficiency: an empty table has no values");
  const std::vector<double>& v = backward_pass ? backward : forward;
  const size_t n = head_size.size();
  auto value = [&](size_t i, size_t j) { return v[i * n + j]; };
  if (seq.size() == 1 && n == 1) return v.front();
  const auto [i, wi] = seq.size() == 1 ? std::pair<size_t, double>{0, 0.0} : locate(seq, T);
  const auto [j, wj] = n == 1 ? std::pair<size_t, double>{0, 0.0} : locate(head_size, hs);
  const size_t i1 = seq.size() == 1 ? i : i + 1, j1 = n == 1 ? j : j + 1;
  return (1 - wi) * ((1 - wj) * value(i, j) + wj * value(i, j1)) +
         wi * ((1 - wj) * value(i1, j) + wj * value(i1, j1));
}

namespace {

std::vector<double> ascending(const nlohmann::json& j, const char* key, const std::string& where) {
  TESSERA_CHECK_AS(ConfigError, j.contains(key) && j.at(key).is_array() && !j.at(key).empty(),
                   where, ": '", key, "' must be a non-empty array");
  std::vector<double> v;
  for (const nlohmann::json& x : j.at(key)) {
    TESSERA_CHECK_AS(ConfigError, x.is_number() && x.get<double>() > 0, where, ": '", key,
                     "' must be positive numbers");
    v.push_back(x.get<double>());
    TESSERA_CHECK_AS(ConfigError, v.size() == 1 || v.back() > v[v.size() - 2], where, ": '", key,
                     "' must be ascending");
  }
  return v;
}

std::vector<double> matrix(const nlohmann::json& j, const char* key, size_t rows, size_t cols,
                           const std::string& where) {
  TESSERA_CHECK_AS(ConfigError, j.contains(key) && j.at(key).is_array() && j.at(key).size() == rows,
                   where, ": '", key, "' must be ", rows, " rows of ", cols);
  std::vector<double> v;
  for (const nlohmann::json& row : j.at(key)) {
    TESSERA_CHECK_AS(ConfigError, row.is_array() && row.size() == cols, where, ": '", key,
                     "' must be ", rows, " rows of ", cols);
    for (const nlohmann::json& x : row) {
      TESSERA_CHECK_AS(ConfigError, x.is_number() && x.get<double>() > 0 && x.get<double>() <= 2,
                       where, ": '", key, "' values must be in (0, 2]");
      v.push_back(x.get<double>());
    }
  }
  return v;
}

nlohmann::json rows_of(const std::vector<double>& v, size_t cols) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < v.size(); i += cols)
    out.push_back(std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(i),
                                      v.begin() + static_cast<std::ptrdiff_t>(i + cols)));
  return out;
}

}  // namespace

AttentionEfficiency attention_efficiency_from_json(const nlohmann::json& j,
                                                   const std::string& source) {
  const std::string where = source + " (attention_efficiency)";
  TESSERA_CHECK_AS(ConfigError, j.is_object(), where, ": must be an object");
  AttentionEfficiency a;
  a.seq = ascending(j, "seq", where);
  a.head_size = ascending(j, "head_size", where);
  a.forward = matrix(j, "forward", a.seq.size(), a.head_size.size(), where);
  a.backward = matrix(j, "backward", a.seq.size(), a.head_size.size(), where);
  return a;
}

nlohmann::json to_json(const AttentionEfficiency& a) {
  return {{"seq", a.seq},
          {"head_size", a.head_size},
          {"forward", rows_of(a.forward, a.head_size.size())},
          {"backward", rows_of(a.backward, a.head_size.size())}};
}

double GemmEfficiencyCache::operator()(double M, double N, double K) const {
  TESSERA_ASSERT(!table_.empty(), "gemm efficiency: no table");
  const std::array<double, 3> key{M, N, K};
  auto it = cache_.find(key);
  if (it == cache_.end()) it = cache_.emplace(key, table_.at(M, N, K)).first;
  return it->second;
}

}  // namespace tessera::plan
