// Data parallelism with ZeRO sharding (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models", SC'20) over the dp axis of a Mesh.
//
// Every rank runs the whole model on its share of the global batch. Gradients are synchronised in
// buckets (consecutive units of the model, padded so every bucket splits into dp equal shards):
//   zero 0  all-reduce each bucket as soon as its gradients are final in the last micro-batch's
//           backward (overlapping the rest of backward); every rank updates every parameter.
//   zero 1  reduce-scatter each bucket instead; rank r updates shard r with its shard of the
//           optimizer state (8 bytes/param / dp), then parameters are all-gathered.
//   zero 2  gradients live in per-bucket buffers only while a bucket's backward runs; each is
//           reduce-scattered into the rank's gradient shard (4 bytes/param / dp) and freed.
//   zero 3  parameters too are sharded: a bucket's parameters are all-gathered just before its
//           forward and again before its backward (the next bucket prefetched), and freed after.
// Model-state bytes per rank for fp32 AdamW (Psi parameters, N ranks): 16 Psi, 8 Psi + 8 Psi/N,
// 4 Psi + 12 Psi/N, 16 Psi/N (+ the buckets in flight).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/core/trace.h"
#include "tessera/io/safetensors.h"
#include "tessera/nn/gpt.h"
#include "tessera/nn/unit_hooks.h"
#include "tessera/optim/optimizer.h"

namespace tessera::parallel {

struct DataParallelOptions {
  int zero = 0;           // ZeRO stage: 0 (plain data parallelism), 1, 2, 3
  double bucket_mb = 25;  // target gradient bucket size in MiB (whole units per bucket)
  bool overlap = true;    // launch bucket communication during backward (false: after it)
};

// How the model must be laid out for this engine: units padded to multiples of 16 * dp floats so
// every bucket splits into equal 64-byte-aligned shards; full buffers only where not sharded.
nn::GPTLayout gpt_layout_for(const DataParallelOptions& o, int dp_size);

// Bytes each rank sends, counted as a ring algorithm moves them: all-reduce 2 (N-1)/N x bytes,
// reduce-scatter and all-gather (N-1)/N x the full (gathered) size.
struct CommVolume {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
  double total() const { return all_reduce + reduce_scatter + all_gather; }
};

using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(
    std::vector<optim::Segment> segments, int64_t state_elems)>;

class DataParallel final : public nn::UnitHooks {
 public:
  // Installs itself as the model's hooks. The model must have been built with
  // gpt_layout_for(o, dp.size()).
  DataParallel(nn::GPT& model, comm::Communicator& dp, const DataParallelOptions& o,
               Allocator& alloc);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Weights: layout-invariant initialisation, or a full-model safetensors file (this rank reads
  // only what it holds).
  void initialize(uint64_t seed);
  void load_weights(const io::SafetensorsFile& file);
  // Creates the optimizer over this rank's segments (all parameters, or its ZeRO shard).
  void create_optimizer(const OptimizerFactory& make);
  optim::Optimizer& optimizer() { return *opt_; }
  // Optimizer state from a file of "<kind>.<parameter name>" tensors (any layout wrote it).
  void load_optimizer_state(const io::SafetensorsFile& file);

  // Collective: the full parameters / optimizer state under their global names, on every rank.
  io::NamedTensors full_weights();
  io::NamedTensors full_optimizer_state();

  // One optimizer step: begin_step(); per micro-batch { begin_micro_batch(last); forward;
  // backward; end_backward(); } grad_norm(); clip(); optimizer_step().
  void begin_step();
  void begin_micro_batch(bool last);
  void end_backward();
  double grad_norm();  // exact global norm over all shards
  void clip(double norm, double max_norm);
  void optimizer_step(float lr);

  const CommVolume& volume() const { return volume_; }
  void reset_volume() { volume_ = {}; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 private:
  struct Bucket {
    int first_unit = 0, last_unit = 0;    // inclusive
    int first_param = 0, last_param = 0;  // [first, last)
    int64_t begin = 0, end = 0;           // flat range
    int64_t shard = 0;                    // (end - begin) / dp
    int64_t shard_offset = 0;             // into the packed shard buffers
    // ZeRO-3 gathered parameters and ZeRO-2/3 gradient buffer while in use.
    Tensor params, grads;
    comm::Work gather;  // prefetch in flight
    bool gathering = false;
    int fwd_done = 0, bwd_done = 0;
    int units() const { return last_unit - first_unit + 1; }
  };
  enum class PendingKind { AllReduce, ReduceScatterInPlace, ReduceScatterAccumulate, AllGather };
  struct Pending {
    PendingKind kind;
    int bucket;
    comm::Work work;
    Tensor buffer;  // kept alive until done (ZeRO-2/3 gradient bucket)
    TraceClock::time_point launched;
  };

  io::NamedTensors parameter_views() const;  // the full flat parameters (zero < 3) by name
  int64_t shard_begin(const Bucket& b) const { return b.begin + rank_ * b.shard; }
  void point_params(Bucket& b, float* base);
  void point_grads(Bucket& b, float* base);
  void ensure_params(int bucket);
  void prefetch(int bucket);
  void release_params(Bucket& b);
  void ensure_grads(int bucket);
  void bucket_backward_done(int bucket);
  void launch(int bucket);
  void finish(Pending& p);
  void drain(size_t keep);  // completes pending ops until at most `keep` remain
  std::vector<optim::Segment> shard_segments() const;
  void trace_comm(const char* name, TraceClock::time_point start);
  template <typename F>
  void for_each_shard_range(F f) const;  // f(bucket, flat_lo, flat_hi, packed offset)

  nn::GPT& model_;
  nn::ParameterSet& ps_;
  comm::Communicator& dp_;
  DataParallelOptions o_;
  Allocator& alloc_;
  int rank_, size_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;
  int64_t shard_elems_ = 0;
  Tensor param_shard_, grad_shard_;  // ZeRO-3 / ZeRO-2,3 packed shards
  std::unique_ptr<optim::Optimizer> opt_;
  std::deque<Pending> pending_;
  std::vector<int> ready_;  // buckets whose gradients are final but not launched (no overlap)
  bool last_micro_ = true;
  CommVolume volume_;
  std::vector<TraceClock::time_point> fwd_start_, bwd_start_;
};

}  // namespace tessera::parallel
