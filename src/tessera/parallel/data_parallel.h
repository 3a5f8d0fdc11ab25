// Data parallelism over the dp axis of a Mesh: every rank runs its model (or pipeline stage) on
// its share of the global batch, and gradients are synchronised in buckets (buckets.h) while
// backward still runs. Where parameters, gradients and optimizer state live, and how a bucket is
// reduced, is the ZeRO stage's strategy (zero.h), chosen once.
//
// The engine is one of the model's UnitHooks: it acquires a bucket's parameters before a unit
// that reads them runs (ZeRO-3), gives its gradients a buffer (ZeRO-2/3), releases them when
// every unit that reads the bucket is done, and launches the bucket's reduction as soon as its
// gradients are final in the micro-batch that reduces.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/io/safetensors.h"
#include "tessera/nn/gpt.h"
#include "tessera/nn/unit_hooks.h"
#include "tessera/optim/optimizer.h"
#include "tessera/parallel/buckets.h"
#include "tessera/parallel/zero.h"

namespace tessera::parallel {

struct DataParallelOptions {
  int zero = 0;           // ZeRO stage: 0 (plain data parallelism), 1, 2, 3
  double bucket_mb = 25;  // target gradient bucket size in MiB (whole units per bucket)
  bool overlap = true;    // launch bucket communication during backward (false: after it)
  // The dtype of the gradient reduction: F32, or BF16 (half the bytes; see ZeroContext).
  DType grad_reduce_dtype = DType::F32;
  // The dtype ZeRO-3 gathers parameters in: F32, or BF16 (half the bytes; see ZeroContext).
  DType param_gather_dtype = DType::F32;
};

// How a model's flat buffers must be laid out for this engine: units padded to multiples of
// 16 * dp floats so every bucket splits into equal 64-byte-aligned shards; full buffers only where
// not sharded. gpt_layout_for: the same for a GPT (`base` with those fields set); its expert
// parameter set is padded for the expert-data-parallel size (0: dp_size).
nn::FlatLayout flat_layout_for(const DataParallelOptions& o, int dp_size);
nn::GPTLayout gpt_layout_for(const DataParallelOptions& o, int dp_size, nn::GPTLayout base = {},
                             int expert_dp_size = 0);

// The other groups a data-parallel replica spans (tensor parallelism): the world, over which the
// gradient norm is summed, the tensor-parallel group, over which checkpoints gather shards, and
// the dp x tp ranks of this pipeline stage, over which the sequence-parallel partial gradients
// (GradReduction::over_tensor_parallel) are summed.
struct ModelParallelGroups {
  comm::Communicator* world = nullptr;  // null: the data-parallel group is the world
  comm::Communicator* tp = nullptr;     // null: no tensor parallelism
  comm::Communicator* stage = nullptr;  // null: no parameter is marked over_tensor_parallel
};

using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(
    std::vector<optim::Segment> segments, int64_t state_elems)>;

class DataParallel final : public nn::UnitHooks {
 public:
  // Adds itself to the model's hooks. The model (a GPT or any UnitModel, nn/unit_model.h) must
  // have been built with flat_layout_for(o, dp.size()) (a GPT: gpt_layout_for); a ConfigError says
  // what differs otherwise. The experts of a mixture-of-experts GPT get their own engine over
  // the expert-data-parallel group: DataParallel(gpt.expert_units(), edp, ...).
  DataParallel(nn::UnitModel& model, comm::Communicator& dp, const DataParallelOptions& o,
               Allocator& alloc, ModelParallelGroups mp = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Weights: layout-invariant initialisation, or a full-model safetensors file (this rank reads
  // only what it holds).
  void initialize(uint64_t seed) { zero_->initialize(seed); }
  void load_weights(const io::SafetensorsFile& file) { zero_->load_weights(file); }
  // Creates the optimizer over this rank's segments (all parameters, or its ZeRO shard).
  void create_optimizer(const OptimizerFactory& make);
  optim::Optimizer& optimizer() { return *opt_; }
  // Optimizer state from a file of "<kind>.<parameter name>" tensors (any layout wrote it).
  void load_optimizer_state(const io::SafetensorsFile& file);

  // Collective: the full parameters / optimizer state under their global names, on every rank
  // (gathered over the data-parallel group, then tensor-parallel shards over the tp group).
  io::NamedTensors full_weights() { return assemble_tensor_parallel(zero_->full_weights()); }
  io::NamedTensors full_optimizer_state() {
    return assemble_tensor_parallel(zero_->full_optimizer_state(*opt_));
  }

  // One optimizer step: begin_step(); per micro-batch { begin_micro_batch(last); forward;
  // backward; } end_backward(); grad_norm(); clip(); optimizer_step().
  void begin_step();
  void begin_micro_batch(bool last) { last_micro_ = last; }
  // Waits for every reduction, then sums the gradients marked over_tensor_parallel (the
  // LayerNorms under sequence parallelism) over the stage's dp x tp ranks: every rank then holds
  // the sum of the tensor-parallel ranks' partial gradients.
  void end_backward();
  // The exact global gradient norm (each global element counted once: counts_in_norm, ZeRO
  // shards, and with ZeRO-0 only data-parallel rank 0's replica; summed over the world).
  double grad_norm();
  // This rank's share of the squared global gradient norm (grad_norm() sums it over the world):
  // for callers that hold several engines (pipeline chunks) and sum them first.
  double grad_norm_contribution();
  // Sums the gradients of the parameters marked over_embedding_group (the tied wte held by the
  // first and the last pipeline stage, Megatron's embedding group) over `group`: every
  // data-parallel rank of both stages (same tensor-parallel rank). Call after end_backward().
  // Each stage contributes its reduced gradient once (the ZeRO shards, which are disjoint, or
  // data-parallel rank 0's replica) and zeros elsewhere, so both stages get the same bits.
  void sum_embedding_group(comm::Communicator& group);
  void clip(double norm, double max_norm);
  void optimizer_step(float lr);

  const CommVolume& volume() const { return volume_; }
  void reset_volume() { volume_ = {}; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  int zero_stage() const { return zero_->stage(); }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;
  void before_backward_weight(int unit) override;

 private:
  // The buckets unit u reads: its own, and the bucket of its tied unit if different.
  template <typename F>
  void for_each_bucket_of(int unit, F f);
  void bucket_backward_done(int bucket);
  void launch(int bucket);
  // Tensors of this rank's local shapes (named "<param>" or "<kind>.<param>") -> full tensors:
  // each tensor-parallel shard placed at its global indices, summed over the tp group.
  io::NamedTensors assemble_tensor_parallel(io::NamedTensors local);
  void drain(size_t keep);  // completes reductions until at most `keep` remain
  // Sums the reduced gradients of the parameters marked `flag` over `group`, each element counted
  // once: each rank places what it holds after the data-parallel reduction (its ZeRO shard, or
  // data-parallel rank 0 its replica) in a zero buffer, one all-reduce, and takes its part back.
  void sum_marked_gradients(comm::Communicator& group, bool nn::GradReduction::*flag,
                            const char* label);

  nn::UnitModel& model_;
  nn::ParameterSet& ps_;
  comm::Communicator& dp_;
  DataParallelOptions o_;
  ModelParallelGroups mp_;
  Allocator& alloc_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;  // index: unit - model.first_unit()
  CommVolume volume_;
  std::unique_ptr<ZeroStrategy> zero_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::deque<Reduction> pending_;
  std::vector<int> ready_;  // buckets whose gradients are final but not launched (no overlap)
  bool last_micro_ = true;
};

}  // namespace tessera::parallel
