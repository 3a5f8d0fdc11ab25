// Internal to the trainer: a step's mixture-of-experts statistics over the whole job
// (nn/moe_router.h defines them), for the progress line and the metrics.
#pragma once

#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/nn/gpt.h"

namespace tessera::train {

struct MoeStepStats {
  struct Layer {
    int layer = 0;
    double balance = 0;             // mean over sequences of balance_s (1 = perfectly balanced)
    double z = 0;                   // mean over tokens of lse^2
    std::vector<double> load;       // [E] share of the router's assignments per expert
    std::vector<int64_t> assigned;  // [E] the router's assignments per expert (exact counts)
    int64_t assignments = 0;        // their sum: tokens x top_k
  };
  std::vector<Layer> layers;
  double aux_loss = 0, z_loss = 0;  // alpha sum_l balance_l, beta sum_l z_l: added to the objective
  double max_load_ratio = 0;        // the busiest expert's share over the mean share (1/E)
  double dropped_fraction = 0;      // dropped assignments / assignments
  double assignments = 0;
  std::vector<double> mean_load;  // [E] load averaged over the layers
};

// Every MoE layer's statistics of the step, summed over the world (collective; `counts`: whether
// this rank's layers count, false on tensor-parallel replicas), so that every rank holds the same
// numbers. Empty without a mixture of experts.
MoeStepStats moe_step_stats(const nn::GPTConfig& model, const std::vector<nn::GPT*>& chunks,
                            bool counts, comm::Communicator& world);

}  // namespace tessera::train
