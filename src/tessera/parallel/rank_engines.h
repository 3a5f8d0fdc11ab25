// A rank's gradient engines as one object: one DataParallel (data_parallel.h) per model chunk and
// parameter set (each chunk's model over the data-parallel group and, for a mixture of experts,
// its experts over the expert-data-parallel group), and what spans several of them or more than
// data parallelism: the sequence-parallel partial gradients summed over the stage's dp x tp ranks,
// the tied embedding summed over the embedding group, one global gradient norm, and the
// checkpoint gather over every group of the mesh. Every layout reads the same: a parallelism the
// layout lacks is a group of one (parallel/mesh.h), which sums and gathers nothing.
//
// One optimizer step, with the pipeline executor (pipeline/step_executor.h) between:
//   begin_step(); [forwards and backwards]; end_backward(); norm = grad_norm();
//   clip(norm, max); step(lr);
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/io/safetensors.h"
#include "tessera/io/tensor_set.h"
#include "tessera/nn/stage_model.h"
#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/mesh.h"

namespace tessera::parallel {

// Bytes this rank sent in the mesh's groups since begin_step (Communicator::traffic: the ring
// convention), by the parallelism that sent them. The world's own reductions (the loss, the norm,
// the stop flag) are bookkeeping and not counted.
struct StepTraffic {
  double data_parallel = 0;     // gradient reductions and parameter gathers (dp x cp, edp x cp),
                                // the sequence-parallel and embedding-group sums
  double zero_replicas = 0;     // of which HSDP's all-reduce of the shards over the replicas
                                // (the bytes that cross hosts when a shard group is a host)
  double tensor_parallel = 0;   // the tensor-parallel group's collectives
  double pipeline = 0;          // activations and gradients sent to other pipeline stages
  double expert_parallel = 0;   // a mixture of experts' dispatch and combine
  double context_parallel = 0;  // the attention's keys and values and a mixture of experts'
                                // routing between the ranks of a sequence
};

class RankEngines {
 public:
  // chunks[c]: this rank's model chunk c, built with gpt_layout_for(o, ...) (or flat_layout_for);
  // each gets an engine over mesh.gradient_group() (dp x cp; ZeRO sharded over
  // mesh.zero_shard_group() and replicated over mesh.zero_replica_group() under HSDP) and, when
  // it has experts, one over
  // mesh.expert_gradient_group() (edp x cp), each with its optimizer from make_optimizer.
  RankEngines(const std::vector<nn::StageModel*>& chunks, const Mesh& mesh,
              const DataParallelOptions& o, Allocator& alloc,
              const OptimizerFactory& make_optimizer);
  RankEngines(const RankEngines&) = delete;
  RankEngines& operator=(const RankEngines&) = delete;

  // Weights: layout-invariant initialisation, or a full-model safetensors file.
  void initialize(uint64_t seed);
  void load_weights(const io::SafetensorsFile& file);
  // Optimizer state from a checkpoint's file (any layout wrote it), and the steps it has taken.
  void load_optimizer_state(const io::SafetensorsFile& file, int64_t optimizer_steps);
  // The first engine's optimizer (all take the same steps).
  const optim::Optimizer& optimizer() const { return engines_.front().engine->optimizer(); }

  // Zeroes the gradients (and the ZeRO-2/3 shards) and the traffic counters.
  void begin_step();
  // The schedule's ReduceGradients: waits for every engine's reductions, then sums the
  // sequence-parallel partial gradients over the stage's ranks and the tied wte over the embedding
  // group.
  void end_backward();
  // The exact global gradient norm: every engine's share (each global element counted once), one
  // reduction over the world.
  double grad_norm();
  void clip(double norm, double max_norm);
  void step(float lr);

  // Collective over the world: every parameter and optimizer-state tensor under its global name,
  // whole (tensor-parallel shards assembled, ZeRO shards gathered, each expert-parallel rank's
  // experts and every pipeline stage's tensors gathered), on world rank 0; the other ranks get a
  // part of it.
  struct Gathered {
    io::NamedTensors weights, optimizer_state;
  };
  Gathered gather();

  StepTraffic traffic() const;
  // Every engine, chunk by chunk (the model's, then its experts').
  std::vector<DataParallel*> engines() const;

 private:
  struct Engine {
    std::unique_ptr<DataParallel> engine;
    bool experts = false;
  };
  // Tensors of an engine's local shapes (named "<param>" or "<kind>.<param>") -> full tensors:
  // each tensor-parallel shard placed at its global indices, summed over the tp group (exact).
  io::NamedTensors assemble_tensor_parallel(const DataParallel& e, io::NamedTensors local);

  const Mesh& mesh_;
  Allocator& alloc_;
  std::vector<Engine> engines_;
};

}  // namespace tessera::parallel
