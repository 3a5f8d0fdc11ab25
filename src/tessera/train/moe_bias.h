// Internal to the trainer: auxiliary-loss-free load balancing of the mixtures of experts
// (DeepSeek-V3, 2024, section 2.1.2; Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing
// Strategy for Mixture-of-Experts"). Each MoE layer has a bias per expert that its router adds to
// the scores to choose a token's top k, never to the gates (nn/moe_router.h); after each optimizer
// step every bias moves by a fixed rate u toward balance,
//   b_i += u sign(mean load - load_i),
// the loads being the step's assignments per expert over the whole job (moe_step_stats: every
// micro-batch, every data-parallel rank, tensor-parallel replicas counted once). Every rank
// computes every layer's biases from the same integer counts, so they are identical everywhere,
// also on the pipeline stages that do not hold the layer (rank 0 saves them all); check_identical
// verifies it. The biases are state, not parameters (no gradient, no optimizer): checkpoints and
// exports hold them beside the weights as "<router>.e_score_correction_bias" [E] (DeepSeek-V3's
// name, nn/moe_experts.h), written while balancing is on or any bias is non-zero, read wherever a
// model is loaded from them.
#pragma once

#include <map>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/io/safetensors.h"
#include "tessera/io/tensor_set.h"
#include "tessera/nn/gpt.h"
#include "tessera/train/moe_stats.h"

namespace tessera::train {

class MoeBias {
 public:
  MoeBias(const nn::GPTConfig& model, float rate);

  // Reads the biases `file` holds under their names (a checkpoint's model, or weights); the
  // layers it has none for keep theirs.
  void load(const io::SafetensorsFile& file);
  // Whether the routers use the biases: balancing is on, or a bias is non-zero.
  bool active() const;
  // After an optimizer step, from that step's loads over the job.
  void update(const MoeStepStats& stats);
  // Gives every MoE layer of these models its bias (when active; else they route without one).
  void apply(const std::vector<nn::GPT*>& models) const;
  // The biases under their names (when active).
  void append_to(io::NamedTensors& out) const;
  // Every rank holds bitwise the same biases (collective over `world`); InternalError if not.
  void check_identical(comm::Communicator& world) const;

  const std::vector<float>& of_layer(int layer) const { return bias_.at(layer); }

 private:
  nn::GPTConfig model_;
  float rate_;
  std::map<int, std::vector<float>> bias_;  // MoE layer -> [E]
};

// The selection bias `name` of a file ([E] floats).
std::vector<float> read_score_bias(const io::SafetensorsFile& file, const std::string& name,
                                   int experts);

}  // namespace tessera::train
