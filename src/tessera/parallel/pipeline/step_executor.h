// Runs one optimizer step as a schedule (schedule.h): this rank's list of actions, executed in
// order, on the rank's model chunks (one per virtual stage; one without interleaving), each a
// contiguous stage of a model (nn::StageModel). What happens at the schedule's two collective
// points, ReduceGradients and OptimizerStep, is the caller's (StepCallbacks: the rank's engines,
// rank_engines.h), so the executor knows nothing of data parallelism or of the model's kind.
//
// Forward and Backward of micro-batch m on chunk c use an activation record taken from the
// chunk's pool when m's input arrives (or its forward starts, on the first stage) and returned
// once its backward has ended (B, or W) and its input gradient has been posted, in whichever
// order the schedule puts them, so a schedule decides how many micro-batches are in flight (and
// so the activation memory), not the executor. The backward says which micro-batch of the step it
// is (nn::BackwardPass), so that the engines' hooks reduce in the last one.
//
// Point-to-point (the pipeline group): a receive blocks until its message arrives (bounded by
// the communicator's deadline); sends are asynchronous. In fp32 an activation is sent straight
// from the record's output and an input gradient from the record (input_grad), and a record is not
// reused before its sends have completed. With a bf16 wire both are rounded into a pooled bf16
// send buffer instead, and a receive lands in a bf16 buffer that is widened into the record's input
// or the output-gradient buffer (comm/wire.h). Messages are tagged with the receiving stage and
// direction; each chunk runs its forwards (and its backwards) in micro-batch order, so messages of
// one tag arrive in the order they are received.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/nn/stage_model.h"
#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::parallel {

// Where the time of the last run went on this rank.
struct StepTiming {
  double compute_seconds = 0;   // in F, B, BI and W
  double pipeline_seconds = 0;  // from the start to the end of the last compute action
  double bubble() const {
    return pipeline_seconds > 0 ? 1.0 - compute_seconds / pipeline_seconds : 0.0;
  }
};

// What the executor asks of its caller during a step.
struct StepCallbacks {
  // Micro-batch m of this rank's share of the step (its buffers valid until the next fetch).
  std::function<nn::Batch(int m)> fetch;
  // ReduceGradients: finish the gradients' reductions (RankEngines::end_backward).
  std::function<void()> reduce_gradients;
  // OptimizerStep, given the sum of the token losses this rank computed (after every send has
  // completed).
  std::function<void(double loss_sum)> optimizer_step;
};

class StepExecutor {
 public:
  // chunks[c]: this rank's model chunk c (model stage c * pp + rank); pp: the pipeline group
  // (one rank: a single stage); wire: what hidden states and their gradients travel in between
  // stages (F32 or BF16).
  StepExecutor(std::vector<nn::StageModel*> chunks, comm::Communicator& pp,
               DType wire = DType::F32);

  // Runs this rank's actions of `schedule` (rank: the pipeline group's rank) with the given step
  // context. boundary_elems: the elements of the hidden state passed between stages per
  // micro-batch. Returns the sum of the token losses this rank computed.
  double run(const Schedule& schedule, const nn::StepContext& ctx, const StepCallbacks& callbacks,
             int64_t boundary_elems);

  // Records allocated so far on chunk c: the peak number of its micro-batches in flight.
  int records_allocated(int chunk = 0) const {
    return static_cast<int>(chunks_[static_cast<size_t>(chunk)].pool.size());
  }
  const StepTiming& timing() const { return timing_; }

 private:
  struct Slot {
    nn::StageRecord* record = nullptr;
    std::vector<comm::Work> sends;  // sends from the record, waited for before it is reused
  };
  struct Chunk {
    nn::StageModel* model = nullptr;
    std::vector<Slot> pool;  // the model's shared record first, then owned ones
    std::vector<std::unique_ptr<nn::StageRecord>> owned;
    std::vector<int> free;     // indices into pool
    std::vector<int> slot_of;  // micro-batch -> pool index, -1 when not in flight
    std::vector<int> dout_of;  // micro-batch -> received output gradient buffer, or -1
    // micro-batch -> what its record waits for before it returns to the pool: the end of its
    // backward (B or W) and, on a stage after the first, the send of its input gradient, in
    // whichever order the schedule runs them.
    std::vector<int> pending_of;
  };
  struct SendBuffer {
    Tensor data;
    comm::Work work;  // default: free
  };

  // A record for micro-batch m, held until `pending` events (done) have happened.
  nn::StageRecord& acquire(Chunk& c, int micro_batch, int pending);
  Slot& in_flight(Chunk& c, int micro_batch);
  void done(Chunk& c, int micro_batch);  // one of the record's pending events; the last releases
  Tensor& output_grad_buffer(int& index, int64_t elems);
  SendBuffer& send_buffer(int64_t elems);  // of the wire's dtype
  // Posts n values of src to `peer` in the wire dtype (rounded into a send buffer under bf16);
  // an fp32 send from a record goes straight from it and is kept on its slot.
  void post_send(Slot& from, const float* src, int64_t n, int peer, int tag);
  // Receives n values from `peer` into dst (fp32), through a bf16 buffer under a bf16 wire.
  void receive(float* dst, int64_t n, int peer, int tag);
  void execute(const Schedule& s, int rank, const Action& a, const nn::StepContext& ctx,
               const StepCallbacks& cb, int64_t boundary_elems, double& loss_sum);
  void finish_sends();
  const float* output_grad_of(Chunk& c, int micro_batch);
  // Tag of a message into model stage `stage`: activations even, gradients odd.
  static int tag(int stage, bool gradient) { return 2 * stage + (gradient ? 1 : 0); }

  std::vector<Chunk> chunks_;
  comm::Communicator& pp_;
  DType wire_;
  std::vector<Tensor> douts_;  // received output gradients
  std::vector<int> free_douts_;
  std::deque<SendBuffer> sends_;  // bf16 wire: rounded activations and input gradients
  Tensor recv_wire_;              // a bf16 receive buffer (bf16 wire only)
  StepTiming timing_;
};

}  // namespace tessera::parallel
