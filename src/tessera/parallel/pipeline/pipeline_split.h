// How the units of a GPT (0 = embedding, 1..L = blocks, L + 1 = head) are cut into the contiguous
// model stages of a pipeline. Balanced by modelled cost, or as the user lists them (--pp-split).
// A cut may fall between a block's attention half and its MLP half (nn::BlockPart): whole blocks
// are too coarse to balance a model whose head costs a fraction of a block (6 blocks + head over
// 2 stages: 1.21x between the stages with whole blocks, 1.05x with halves).
#pragma once

#include <string>
#include <vector>

#include "tessera/nn/gpt_config.h"

namespace tessera::parallel {

struct UnitRange {
  int first = 0, last = 0;  // inclusive global unit ids
  // The stage begins with the MLP half of block `first` / ends after the attention half of block
  // `last` (nn::GPTLayout's fields of the same names).
  bool starts_mid_block = false;
  bool ends_mid_block = false;
  friend bool operator==(const UnitRange&, const UnitRange&) = default;
};

// Modelled forward + backward FLOPs per token of each unit at context T (nn/gpt_costs.h, 3x the
// forward's matmuls): the embedding a gather and a scatter-add (~4C), a block 3 x (8 C^2 + 4 T C)
// for its attention (causal mask ignored) and 3 x 16 C^2 for its MLP (an MoE block: top_k expert
// MLPs and its router 2 C E), the head 3 x 2 C V for the tied projection plus ~10 V for the
// softmax and cross-entropy.
std::vector<double> unit_costs(const nn::GPTConfig& cfg, int T);
// The same at half-block grain, 2L + 2 entries: the embedding, then per block its attention half
// (6 x 4 C^2 + 12 T C) and its MLP half (6 x 8 C^2, or the MoE's), then the head.
std::vector<double> half_unit_costs(const nn::GPTConfig& cfg, int T);
// Ranges over half_unit_costs' entries as units: [0, 2L + 1] -> [0, L + 1], entry 2l + 1 the
// attention half of block l (unit l + 1), entry 2l + 2 its MLP half.
UnitRange units_of_halves(const UnitRange& halves, int n_layer);

// Contiguous stages minimising the most expensive stage (exact, by dynamic programming over
// the cut points). ConfigError when there are more stages than units.
std::vector<UnitRange> balanced_split(const std::vector<double>& costs, int stages);

// "4,4" (units per stage, in order, summing to L + 2); a block's halves count 0.5 each, so
// "4.5,3.5" cuts block 3 (unit 4) after its attention. ConfigError naming --pp-split when the
// list has the wrong length, a stage has no unit, a count is not a multiple of 0.5, a cut falls
// inside the embedding or the head, or the counts do not add up.
std::vector<UnitRange> parse_split(const std::string& spec, int num_units, int stages);

// The stages of a run: parse_split when `spec` is given, else balanced_split of half_unit_costs.
std::vector<UnitRange> pipeline_split(const nn::GPTConfig& cfg, int T, int stages,
                                      const std::string& spec);

// "[0-3] [4-7]"; a half block as "4(attn)" / "4(mlp)": "[0-4(attn)] [4(mlp)-7]".
std::string to_string(const std::vector<UnitRange>& split);

}  // namespace tessera::parallel
