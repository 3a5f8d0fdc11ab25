// Runs one optimizer step as a schedule (parallel/schedule.h): this rank's list of actions,
// executed in order. The rank holds one model chunk per virtual stage (one without interleaving),
// each a contiguous stage of the model with its own data-parallel engine.
//
// Forward and Backward of micro-batch m on chunk c use an activation record taken from the
// chunk's pool when m's input arrives (or its forward starts, on the first stage) and returned
// when its backward ends, so a schedule decides how many micro-batches are in flight (and so the
// activation memory), not the executor.
//
// Point-to-point (pipeline ranks): a receive blocks until its message arrives (bounded by the
// communicator's deadline); sends are asynchronous. In fp32 an activation is sent straight from the
// record's output, which stays alive until the micro-batch's backward; an input gradient is copied
// into a send buffer first, because the next backward overwrites it. With a bf16 wire
// (PipelineLinks::wire) both are rounded into a bf16 send buffer instead, and a receive lands in a
// bf16 buffer that is widened into the record's input or the output-gradient buffer (nn/wire.h).
// Messages are tagged with the receiving stage and direction; each chunk runs its forwards (and its
// backwards) in micro-batch order, so messages of one tag arrive in the order they are received.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/nn/gpt.h"
#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/schedule.h"

namespace tessera::train {

// One model chunk of this rank: a stage of the model and the engine that reduces its gradients
// (and, for a mixture of experts, the engine of its experts over the expert-data-parallel group).
struct StageChunk {
  nn::GPT* model = nullptr;
  parallel::DataParallel* engine = nullptr;
  parallel::DataParallel* experts = nullptr;
};

// This rank's pipeline groups (all null for one stage).
struct PipelineLinks {
  comm::Communicator* pp = nullptr;  // the pipeline ranks of this rank's (dp, tp) coordinates
  // The data-parallel ranks of the first and the last stage (same tp rank): the tied wte's
  // gradients are summed over it. Null on ranks that hold neither.
  comm::Communicator* embedding_group = nullptr;
  // What activations and their gradients travel in between stages: F32 or BF16.
  DType wire = DType::F32;
};

// Where the time of the last run went on this rank.
struct StepTiming {
  double compute_seconds = 0;   // in F, B, BI and W
  double pipeline_seconds = 0;  // from the start to the end of the last compute action
  double bubble() const {
    return pipeline_seconds > 0 ? 1.0 - compute_seconds / pipeline_seconds : 0.0;
  }
};

class StepExecutor {
 public:
  StepExecutor(std::vector<StageChunk> chunks, PipelineLinks links = {});

  // Runs `rank`'s actions of `schedule` with the given step context. fetch(m) returns micro-batch
  // m (its buffers valid until the next fetch); optimizer_step(loss_sum) is the OptimizerStep
  // action, given the sum of the token losses this rank computed. boundary_elems: the elements
  // of the hidden state passed between stages per micro-batch. Returns that sum.
  double run(const parallel::Schedule& schedule, int rank, const nn::StepContext& ctx,
             const std::function<nn::Batch(int)>& fetch,
             const std::function<void(double)>& optimizer_step, int64_t boundary_elems = 0);

  // Records allocated so far on chunk c: the peak number of its micro-batches in flight.
  int records_allocated(int chunk = 0) const {
    return static_cast<int>(chunks_[static_cast<size_t>(chunk)].pool.size());
  }
  const StepTiming& timing() const { return timing_; }
  // Bytes this rank sent to other pipeline ranks in the last run.
  double sent_bytes() const { return sent_bytes_; }

 private:
  struct Chunk {
    StageChunk stage;
    std::vector<nn::GPT::Record*> pool;  // the model's single record first, then owned
    std::vector<std::unique_ptr<nn::GPT::Record>> owned;
    std::vector<int> free;             // indices into pool
    std::vector<int> slot_of;          // micro-batch -> pool index, -1 when not in flight
    std::vector<comm::Work> sends_of;  // micro-batch -> its activation send (waited at release)
    std::vector<int> dout_of;          // micro-batch -> received output gradient buffer, or -1
  };
  struct SendBuffer {
    Tensor data;
    comm::Work work;  // default: free
  };

  nn::GPT::Record& acquire(Chunk& c, int micro_batch);
  nn::GPT::Record& in_flight(Chunk& c, int micro_batch);
  void release(Chunk& c, int micro_batch);
  void begin_micro_batch(Chunk& c, bool last);
  Tensor& buffer(std::vector<Tensor>& pool, std::vector<int>& free, int& index, int64_t elems);
  SendBuffer& send_buffer(int64_t elems);  // of PipelineLinks::wire's dtype
  // Posts n values of src to `peer` in the wire dtype (rounded into a send buffer under bf16).
  comm::Work post_send(const float* src, int64_t n, int peer, int tag, bool copy_fp32);
  // Receives n values from `peer` into dst (fp32), through a bf16 buffer under a bf16 wire.
  void receive(float* dst, int64_t n, int peer, int tag);
  void execute(const parallel::Schedule& s, int rank, const parallel::Action& a,
               const nn::StepContext& ctx, const std::function<nn::Batch(int)>& fetch,
               int64_t boundary_elems, double& loss_sum);
  void reduce_gradients();
  void finish_sends();
  // Tag of a message into model stage `stage`: activations even, gradients odd.
  static int tag(int stage, bool gradient) { return 2 * stage + (gradient ? 1 : 0); }

  std::vector<Chunk> chunks_;
  PipelineLinks links_;
  std::vector<Tensor> douts_;  // received output gradients
  std::vector<int> free_douts_;
  std::deque<SendBuffer> sends_;  // input gradients sent (and, under bf16, activations)
  Tensor recv_wire_;              // a bf16 receive buffer (bf16 wire only)
  StepTiming timing_;
  double sent_bytes_ = 0;
};

}  // namespace tessera::train
