// How the units of a GPT (0 = embedding, 1..L = blocks, L + 1 = head) are cut into the contiguous
// model stages of a pipeline. Balanced by modelled cost, or as the user lists them (--pp-split).
#pragma once

#include <string>
#include <vector>

#include "tessera/nn/gpt_config.h"

namespace tessera::parallel {

struct UnitRange {
  int first = 0, last = 0;  // inclusive global unit ids
  int size() const { return last - first + 1; }
  friend bool operator==(const UnitRange&, const UnitRange&) = default;
};

// Modelled forward + backward FLOPs per token of each unit at context T: the embedding a gather
// and a scatter-add (~4C), a block 6 * (12 C^2) for its matmuls plus 6 * 2 T C for attention
// (PaLM's count, causal mask ignored; an MoE block counts top_k MLPs of 8 C^2 and its router C E
// instead of one MLP), the head 6 C V for the tied projection plus ~10 V for the softmax and
// cross-entropy.
std::vector<double> unit_costs(const nn::GPTConfig& cfg, int T);

// Contiguous stages minimising the most expensive stage (exact, by dynamic programming over
// the cut points). ConfigError when there are more stages than units.
std::vector<UnitRange> balanced_split(const std::vector<double>& costs, int stages);

// "4,4" (units per stage, in order, summing to L + 2). ConfigError naming --pp-split when the
// list has the wrong length, a stage has no unit, or the counts do not add up.
std::vector<UnitRange> parse_split(const std::string& spec, int num_units, int stages);

// The stages of a run: parse_split when `spec` is given, else balanced_split of unit_costs.
std::vector<UnitRange> pipeline_split(const nn::GPTConfig& cfg, int T, int stages,
                                      const std::string& spec);

std::string to_string(const std::vector<UnitRange>& split);  // "[0-3] [4-7]"

}  // namespace tessera::parallel
