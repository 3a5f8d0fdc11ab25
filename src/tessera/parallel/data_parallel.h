// Data parallelism over one group: every rank runs its model (or pipeline stage) on its share of
// the global batch, and gradients are synchronised in buckets (buckets.h) while backward still
// runs. Where parameters, gradients and optimizer state live, and how a bucket is reduced, is the
// ZeRO stage's strategy (zero.h), chosen once.
//
// The engine is one of the model's UnitHooks: it acquires a bucket's parameters before a unit
// that reads them runs (ZeRO-3), gives its gradients a buffer (ZeRO-2/3), releases them when
// every unit that reads the bucket is done, and launches the bucket's reduction as soon as its
// gradients are final in the micro-batch that reduces (the backward says which micro-batch it
// is: nn::BackwardPass).
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
#include "tessera/parallel/zero_stage.h"

namespace tessera::parallel {

struct DataParallelOptions {
  ZeroStage zero = ZeroStage::None;
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

// HSDP (zero.h): ZeRO shards over `shard`, a subgroup of the data-parallel group (a host's ranks),
// and each reduced shard is all-reduced over `replicas` (the ranks with the same shard in the
// other subgroups). Both null: ZeRO shards over the whole group.
struct HybridShards {
  comm::Communicator* shard = nullptr;
  comm::Communicator* replicas = nullptr;
};

using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(
    std::vector<optim::Segment> segments, int64_t state_elems)>;

// One parameter set's data parallelism over one group. A rank's several engines (pipeline chunks,
// a mixture of experts' experts) and the groups beyond data parallelism (tensor-parallel shards,
// sequence-parallel partial gradients, the tied embedding across stages, the global norm) are
// composed by RankEngines (rank_engines.h).
class DataParallel final : public nn::UnitHooks {
 public:
  // Adds itself to the model's hooks. The model (a GPT or any UnitModel, nn/unit_model.h) must
  // have been built with flat_layout_for(o, dp.size()) (a GPT: gpt_layout_for); a ConfigError says
  // what differs otherwise. The experts of a mixture-of-experts GPT get their own engine over
  // the expert-data-parallel group: DataParallel(gpt.expert_units(), edp, ...). With `hybrid`
  // (HSDP, ZeRO 1-3 only), the layout is flat_layout_for(o, hybrid.shard->size()).
  DataParallel(nn::UnitModel& model, comm::Communicator& dp, const DataParallelOptions& o,
               Allocator& alloc, HybridShards hybrid = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Weights: layout-invariant initialisation, or a full-model safetensors file (this rank reads
  // only what it holds).
  void initialize(uint64_t seed) { zero_->initialize(seed); }
  void load_weights(const io::SafetensorsFile& file) {
    zero_->load_weights(file);
    ps_.bf16_copies_stale();
  }
  // Creates the optimizer over this rank's segments (all parameters, or its ZeRO shard).
  void create_optimizer(const OptimizerFactory& make);
  optim::Optimizer& optimizer() { return *opt_; }
  // Optimizer state from a file of "<kind>.<parameter name>" tensors (any layout wrote it).
  void load_optimizer_state(const io::SafetensorsFile& file);

  // Collective over the data-parallel group: the parameters / optimizer state under their global
  // names, ZeRO shards gathered, on every rank. A tensor-parallel model's tensors are this rank's
  // shards (RankEngines assembles them).
  io::NamedTensors full_weights() { return zero_->full_weights(); }
  io::NamedTensors full_optimizer_state() { return zero_->full_optimizer_state(*opt_); }

  // One optimizer step: begin_step(); per micro-batch { forward; backward, saying which
  // micro-batch it is (nn::BackwardPass) }; end_backward(); grad_norm(); clip(); optimizer_step().
  void begin_step();
  // Waits for every bucket's reduction.
  void end_backward();
  // The exact gradient norm of this engine's parameter set over the data-parallel group (each
  // global element counted once: ZeRO shards, or data-parallel rank 0's replica).
  double grad_norm();
  // This rank's share of the squared norm (zero on a ZeRO-0 replica other than data-parallel rank
  // 0), for callers that add several engines over a wider group in one reduction.
  double grad_norm_contribution();
  // Sums over `group` the reduced gradients of the parameters marked `flag` (GradReduction: the
  // sequence-parallel partial sums over the pipeline stage's dp x tp ranks, the tied wte over the
  // embedding group of the first and the last stage). Call after end_backward(). Each rank
  // contributes its part once (its ZeRO shard, which is disjoint, or data-parallel rank 0 its
  // replica; zeros elsewhere), so every rank gets the same bits. A no-op on a group of one rank or
  // without marked parameters.
  void sum_marked_gradients(comm::Communicator& group, bool nn::GradReduction::*flag,
                            const char* label);
  // Clips to max_norm, given the global norm: the next optimizer_step() reads the gradients
  // times optim::clip_scale(norm, max_norm); the gradients themselves stay as they are.
  void clip(double norm, double max_norm);
  void optimizer_step(float lr);

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  ZeroStage zero_stage() const { return zero_->stage(); }
  const nn::ParameterSet& params() const { return ps_; }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit, const nn::BackwardPass& pass) override;
  void before_backward_weight(int unit) override;

 private:
  // The buckets unit u reads: its own, and the bucket of its tied unit if different.
  template <typename F>
  void for_each_bucket_of(int unit, F f);
  void bucket_backward_done(int bucket, const nn::BackwardPass& pass);
  void launch(int bucket);
  void drain(size_t keep);  // completes reductions until at most `keep` remain
  // Whether this rank's segments count in sums over the group: its ZeRO shard on one replica
  // (the first), or the whole replicated set on data-parallel rank 0.
  bool counts_once() const;

  nn::UnitModel& model_;
  nn::ParameterSet& ps_;
  comm::Communicator& dp_;
  comm::Communicator& shard_;     // ZeRO's group: dp_, or the HSDP shard group
  comm::Communicator* replicas_;  // HSDP only
  DataParallelOptions o_;
  Allocator& alloc_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;  // index: unit - model.first_unit()
  std::unique_ptr<ZeroStrategy> zero_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::deque<Reduction> pending_;
  std::vector<int> ready_;  // buckets whose gradients are final but not launched (no overlap)
  bool grads_zeroed_by_step_ = false;  // the last optimizer step left every gradient zero
};

}  // namespace tessera::parallel
