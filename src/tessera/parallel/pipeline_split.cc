#include "tessera/parallel/pipeline_split.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "tessera/core/error.h"

namespace tessera::parallel {

std::vector<double> unit_costs(const nn::GPTConfig& cfg, int T) {
  const double C = cfg.n_embd, V = cfg.vocab_size;
  std::vector<double> costs(static_cast<size_t>(cfg.n_layer) + 2);
  costs.front() = 4 * C;
  for (int l = 1; l <= cfg.n_layer; ++l) {
    // 6 x (attention 4 C^2 + MLP 8 C^2) per token; an MoE block runs top_k MLPs and its router.
    const bool moe = cfg.moe.is_moe_layer(l - 1);
    const double mlp = moe ? 8 * C * C * cfg.moe.top_k + C * cfg.moe.experts : 8 * C * C;
    costs[static_cast<size_t>(l)] = 6 * (4 * C * C + mlp) + 12 * T * C;
  }
  costs.back() = 6 * C * V + 10 * V;
  return costs;
}

std::vector<UnitRange> balanced_split(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  TESSERA_CHECK_AS(ConfigError, stages >= 1 && stages <= n, "cannot cut ", n,
                   " units (the embedding, ", n - 2, " blocks and the head) into ", stages,
                   " pipeline stages: each stage needs at least one unit");
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[static_cast<size_t>(i)];
  auto cost = [&](int a, int b) { return prefix[b] - prefix[a]; };  // units [a, b)
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the least possible maximum stage cost of units [0, i) in s stages; ties go to
  // the later cut, so earlier stages (which hold more micro-batches in flight) get less.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int i = s; i <= n; ++i)
      for (int j = s - 1; j < i; ++j) {
        const double v = std::max(best[s - 1][j], cost(j, i));
        if (v < best[s][i]) best[s][i] = v, cut[s][i] = j;
      }
  std::vector<UnitRange> out(static_cast<size_t>(stages));
  for (int s = stages, i = n; s >= 1; --s) {
    const int j = cut[s][i];
    out[static_cast<size_t>(s - 1)] = UnitRange{j, i - 1};
    i = j;
  }
  return out;
}

std::vector<UnitRange> parse_split(const std::string& spec, int num_units, int stages) {
  std::vector<int> counts;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TESSERA_CHECK_AS(ConfigError, used == item.size() && v >= 1, "--pp-split '", spec, "': '", item,
                     "' is not a positive number of units");
    counts.push_back(v);
  }
  TESSERA_CHECK_AS(ConfigError, static_cast<int>(counts.size()) == stages, "--pp-split '", spec,
                   "' lists ", counts.size(), " stages but the pipeline has ", stages,
                   " (--pp x --virtual-stages)");
  int total = 0;
  for (int c : counts) total += c;
  TESSERA_CHECK_AS(ConfigError, total == num_units, "--pp-split '", spec, "' covers ", total,
                   " units but the model has ", num_units, " (the embedding, ", num_units - 2,
                   " blocks and the head)");
  std::vector<UnitRange> out;
  int first = 0;
  for (int c : counts) {
    out.push_back(UnitRange{first, first + c - 1});
    first += c;
  }
  return out;
}

std::vector<UnitRange> pipeline_split(const nn::GPTConfig& cfg, int T, int stages,
                                      const std::string& spec) {
  if (!spec.empty()) return parse_split(spec, cfg.n_layer + 2, stages);
  return balanced_split(unit_costs(cfg, T), stages);
}

std::string to_string(const std::vector<UnitRange>& split) {
  std::string s;
  for (const UnitRange& r : split) {
    if (!s.empty()) s += ' ';
    s += '[';
    s += std::to_string(r.first);
    s += '-';
    s += std::to_string(r.last);
    s += ']';
  }
  return s;
}

}  // namespace tessera::parallel
