// ZeRO stages as strategies (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", SC'20), chosen once when data parallelism starts. Each says where a
// rank's parameters, gradients and optimizer state live and how a gradient bucket is reduced:
//   stage 0  replicated: all-reduce each bucket; every rank updates every parameter.
//   stage 1  optimizer state sharded: reduce-scatter each bucket in place; rank r updates shard r
//            with its shard of the state (8 bytes/param / dp), then parameters are all-gathered.
//   stage 2  + gradients sharded: a bucket's gradients live in a temporary buffer while its
//            backward runs, reduce-scattered into the rank's gradient shard (4 bytes/param / dp).
//   stage 3  + parameters sharded: a bucket's parameters are all-gathered before its forward and
//            again before its backward (the next bucket prefetched), and freed after; under
//            --param-gather-dtype bf16 each rank rounds its fp32 shard to bf16 for the gather
//            (half the bytes) and the gathered bucket is widened into an fp32 working copy.
// Model-state bytes per rank for fp32 AdamW (Psi parameters, N ranks): 16 Psi, 8 Psi + 8 Psi/N,
// 4 Psi + 12 Psi/N, 16 Psi/N (+ the buckets in flight).
//
// Shards: with ZeRO every bucket splits into dp equal shards; rank r's shard of bucket b is the
// flat range [b.begin + r * b.shard, + b.shard), and the shards of all buckets are packed in flat
// order into the rank's shard buffers (Bucket::shard_offset).
//
// Hybrid sharding (HSDP, ZeroContext::replicas): `dp` is then the shard group (a host's ranks)
// and the replica group holds the ranks with the same shard in the other groups. A bucket's
// gradients are reduce-scattered inside the shard group (each micro-batch's, at ZeRO 2/3), then,
// at the end of the backward, each rank's reduced shards are all-reduced over its replicas once
// per step (bytes across hosts: 2 (R-1)/R of the shards per rank); parameters are gathered
// inside the shard group only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/core/allocator.h"
#include "tessera/core/trace.h"
#include "tessera/io/safetensors.h"
#include "tessera/io/tensor_set.h"
#include "tessera/nn/parameters.h"
#include "tessera/optim/optimizer.h"
#include "tessera/parallel/buckets.h"
#include "tessera/parallel/zero_stage.h"

namespace tessera::parallel {

// Reads of a full tensor `name` (stored with `info`'s global shape) that fill the local elements
// [local_begin, local_begin + n) of `info` at dst: one run per stretch of consecutive global
// indices (a tensor-parallel shard, a piece of a ZeRO shard, or both).
void append_slice_reads(std::vector<io::SliceRead>& reads, const std::string& name,
                        const nn::ParamInfo& info, int64_t local_begin, int64_t n, float* dst);

// What a strategy works on (owned by the DataParallel engine).
struct ZeroContext {
  nn::ParameterSet& ps;
  comm::Communicator& dp;
  Allocator& alloc;
  std::vector<Bucket>& buckets;
  // The dtype gradients are reduced in: F32, or BF16 (each bucket rounded to bf16 before the
  // collective, which sums in fp32 per combining step, and widened back to fp32 after: half the
  // bytes; accumulation over micro-batches stays fp32).
  DType grad_dtype = DType::F32;
  // The dtype ZeRO-3 gathers parameters in: F32, or BF16 (every rank rounds its fp32 master shard
  // to bf16 for the all-gather, and the gathered bucket is widened into fp32: the model then reads
  // the bf16 values of every parameter of the bucket; half the bytes). Stages 0-2 ignore it: their
  // parameter gathers after the optimizer step write the full fp32 parameters each rank keeps.
  DType param_dtype = DType::F32;
  // HSDP: the ranks holding the same shards as this one in the other shard groups (null: none).
  comm::Communicator* replicas = nullptr;
};

// A bucket's gradient reduction in flight.
struct Reduction {
  int bucket = 0;
  comm::Work work;
  Tensor buffer;          // kept alive until done (ZeRO-2/3 gradient bucket)
  Tensor wire;            // --grad-reduce-dtype bf16: the bucket's gradients as reduced, bf16
  const char* name = "";  // timeline label
  TraceClock::time_point launched;
};

class ZeroStrategy {
 public:
  explicit ZeroStrategy(const ZeroContext& c);
  virtual ~ZeroStrategy() = default;
  virtual ZeroStage stage() const = 0;

  // The optimizer's segments on this rank and the size of its state buffers.
  virtual std::vector<optim::Segment> segments() const = 0;
  virtual int64_t state_elems() const = 0;
  // Whether the ranks' segments are disjoint pieces of the model (their norms add up over the
  // data-parallel group) rather than replicas.
  bool sharded() const { return traits(stage()).sharded(); }

  // Weights: layout-invariant initialisation; a full-model file of which this rank reads what it
  // holds; the full parameters / optimizer state under global names (collective).
  virtual void initialize(uint64_t seed);
  virtual void load_weights(const io::SafetensorsFile& file);
  virtual io::NamedTensors full_weights();
  virtual io::NamedTensors full_optimizer_state(optim::Optimizer& opt);

  // A pipeline stage holds part of the model: a full-model file has tensors it does not read.
  void set_pipeline_stage(bool stage) { pipeline_stage_ = stage; }

  virtual void zero_grads() { c_.ps.zero_grads(); }
  // ZeRO-2/3 hold no full gradient between micro-batches, so they reduce every micro-batch;
  // stages 0/1 accumulate and reduce after the last one.
  bool reduce_every_micro_batch() const { return traits(stage()).reduces_every_micro_batch; }
  virtual void acquire_params(int bucket) { (void)bucket; }   // ZeRO-3: gathered, pointed at
  virtual void prefetch_params(int bucket) { (void)bucket; }  // ZeRO-3: start the gather
  virtual void release_params(int bucket) { (void)bucket; }   // ZeRO-3: freed
  virtual void acquire_grads(int bucket) { (void)bucket; }    // ZeRO-2/3: a gradient buffer
  virtual Reduction launch(int bucket) = 0;                   // asynchronous
  virtual void finish(Reduction& r) { (void)r; }              // after r.work completed
  // HSDP: sums this rank's reduced shards over its replicas, once every bucket of the step is
  // reduced inside the shard group (a fixed point of every rank's program: a wait there cannot
  // meet a replica that waits for this rank elsewhere, as a wait at the first completed
  // reduction could). A no-op without replicas.
  virtual void reduce_over_replicas() {}
  virtual void after_optimizer_step() {}

 protected:
  io::NamedTensors parameter_views() const;  // the flat parameters by name
  // The shard ranges of every bucket in flat order: f(bucket, flat lo, flat hi, packed offset).
  template <typename F>
  void for_each_shard(F f) const {
    for (auto it = c_.buckets.rbegin(); it != c_.buckets.rend(); ++it)
      f(*it, it->begin + rank_ * it->shard, it->begin + (rank_ + 1) * it->shard, it->shard_offset);
  }
  // Gathers every bucket's shard of `packed` into a full flat buffer; views by parameter name,
  // each prefixed with `prefix`.
  io::NamedTensors gather_shards(const float* packed, const std::string& prefix,
                                 const std::string& label);

  ZeroContext c_;
  int rank_, size_;
  int64_t shard_elems_ = 0;  // elements of this rank's packed shards
  bool pipeline_stage_ = false;
};

std::unique_ptr<ZeroStrategy> make_zero_strategy(ZeroStage stage, const ZeroContext& c);

}  // namespace tessera::parallel
