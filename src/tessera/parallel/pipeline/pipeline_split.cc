#include "tessera/parallel/pipeline/pipeline_split.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "tessera/core/error.h"
#include "tessera/nn/gpt_costs.h"

namespace tessera::parallel {

std::vector<double> half_unit_costs(const nn::GPTConfig& cfg, int T) {
  // Forward + backward is 3x the forward's matmul FLOPs (nn/gpt_costs.h).
  const double C = cfg.n_embd, V = cfg.vocab_size;
  std::vector<double> costs;
  costs.push_back(4 * C);  // the embedding: a gather and a scatter-add
  for (int l = 0; l < cfg.n_layer; ++l) {
    const nn::BlockFlops f = nn::block_flops(cfg, l, T);
    costs.push_back(3 * f.attention());
    costs.push_back(3 * f.mlp_half(nn::mlp_passes(cfg, l)));
  }
  costs.push_back(3 * nn::head_flops(cfg) + 10 * V);  // + the softmax and cross-entropy
  return costs;
}

std::vector<double> unit_costs(const nn::GPTConfig& cfg, int T) {
  const std::vector<double> half = half_unit_costs(cfg, T);
  std::vector<double> costs{half.front()};
  for (int l = 0; l < cfg.n_layer; ++l)
    costs.push_back(half[static_cast<size_t>(2 * l + 1)] + half[static_cast<size_t>(2 * l + 2)]);
  costs.push_back(half.back());
  return costs;
}

UnitRange units_of_halves(const UnitRange& halves, int n_layer) {
  // Entry 0 is unit 0, entries 2l + 1 and 2l + 2 unit l + 1, entry 2L + 1 unit L + 1.
  auto unit = [&](int e) { return e == 2 * n_layer + 1 ? n_layer + 1 : (e + 1) / 2; };
  UnitRange r{unit(halves.first), unit(halves.last)};
  r.starts_mid_block = halves.first > 0 && halves.first <= 2 * n_layer && halves.first % 2 == 0;
  r.ends_mid_block = halves.last > 0 && halves.last <= 2 * n_layer && halves.last % 2 == 1;
  return r;
}

std::vector<UnitRange> balanced_split(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  TESSERA_CHECK_AS(ConfigError, stages >= 1 && stages <= n, "cannot cut ", n, " units into ",
                   stages, " pipeline stages: each stage needs at least one unit");
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
  std::vector<int> halves;  // each stage's count, in half units
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    const double twice = 2 * v;
    TESSERA_CHECK_AS(ConfigError, used == item.size() && v >= 0.5 && twice == std::floor(twice),
                     "--pp-split '", spec, "': '", item,
                     "' is not a positive number of units (whole, or with .5 for half a block)");
    halves.push_back(static_cast<int>(twice));
  }
  TESSERA_CHECK_AS(ConfigError, static_cast<int>(halves.size()) == stages, "--pp-split '", spec,
                   "' lists ", halves.size(), " stages but the pipeline has ", stages,
                   " (--pp x --virtual-stages)");
  int total = 0;
  for (int c : halves) total += c;
  TESSERA_CHECK_AS(ConfigError, total == 2 * num_units, "--pp-split '", spec, "' covers ",
                   total / 2.0, " units but the model has ", num_units, " (the embedding, ",
                   num_units - 2, " blocks and the head)");
  // In half units the embedding is [0, 2), block l [2l + 2, 2l + 4), the head the last two: a cut
  // at an odd position falls inside a unit, which must be a block. Entries of half_unit_costs
  // (one for the embedding and the head, two per block) follow.
  const int L = num_units - 2;
  std::vector<UnitRange> out;
  int first = 0;  // in half units
  auto entry = [&](int h) { return h == 0 ? 0 : h >= 2 * L + 2 ? 2 * L + 1 : h - 1; };
  for (int c : halves) {
    const int end = first + c;  // exclusive
    TESSERA_CHECK_AS(ConfigError, end % 2 == 0 || (end > 2 && end < 2 * L + 2), "--pp-split '",
                     spec, "' cuts ", end == 1 ? "the embedding" : "the head",
                     " in half; only a block can be split (between its attention and its MLP)");
    out.push_back(units_of_halves(UnitRange{entry(first), entry(end - 1)}, L));
    first = end;
  }
  return out;
}

std::vector<UnitRange> pipeline_split(const nn::GPTConfig& cfg, int T, int stages,
                                      const std::string& spec) {
  if (!spec.empty()) return parse_split(spec, cfg.n_layer + 2, stages);
  TESSERA_CHECK_AS(ConfigError, stages >= 1 && stages <= cfg.n_layer + 2, "cannot cut ",
                   cfg.n_layer + 2, " units (the embedding, ", cfg.n_layer,
                   " blocks and the head) into ", stages,
                   " pipeline stages: each stage needs at least one unit");
  std::vector<UnitRange> out = balanced_split(half_unit_costs(cfg, T), stages);
  for (UnitRange& r : out) r = units_of_halves(r, cfg.n_layer);
  return out;
}

std::string to_string(const std::vector<UnitRange>& split) {
  std::string s;
  for (const UnitRange& r : split) {
    if (!s.empty()) s += ' ';
    s += '[' + std::to_string(r.first) + (r.starts_mid_block ? "(mlp)" : "") + '-' +
         std::to_string(r.last) + (r.ends_mid_block ? "(attn)" : "") + ']';
  }
  return s;
}

}  // namespace tessera::parallel
