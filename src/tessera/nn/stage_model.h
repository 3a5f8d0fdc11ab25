// One pipeline stage of a model on one rank, as the pipeline executor
// (parallel/pipeline/step_executor.h) and the rank's engines (parallel/rank_engines.h) drive it: a
// UnitModel (its parameters cut into units, with hooks around each unit's passes) that runs
// micro-batches over records the caller owns. A stage holding the whole model is the one-stage
// case. nn::GPT is one; a model written from tessera's modules can be another, and then runs under
// every schedule and ZeRO stage unchanged (tests/parallel/step_executor_test.cc drives a toy one).
//
// The contract, besides the UnitModel's (nn/unit_model.h):
//   * a record holds one micro-batch's activations from its forward to its backward (or its W);
//     any number may be in flight (the schedule decides how many);
//   * a stage that is not the first reads its input from input(rec), which the caller fills
//     before forward; the first stage reads the batch's tokens;
//   * a stage that is not the last starts its backward from dout = dL/d output(rec), the last
//     from its loss; after the backward (or backward_input), input_grad(rec) holds dL/d input, in
//     the record, until the record's next forward (it may reuse the input's buffer);
//   * backward and backward_weight say which micro-batch of the step they are (BackwardPass), and
//     pass it to the hooks, so that data parallelism reduces in the right one;
//   * hidden states passed between stages have hidden_elems(B, T) elements per micro-batch (the
//     same on every rank of a stage's tensor-parallel group).
#pragma once

#include <cstdint>
#include <memory>

#include "tessera/nn/gpt_config.h"
#include "tessera/nn/unit_hooks.h"
#include "tessera/nn/unit_model.h"

namespace tessera::nn {

// The activations of one micro-batch on a stage (each StageModel has its own kind).
struct StageRecord {
  virtual ~StageRecord() = default;
};

class StageModel : public UnitModel {
 public:
  virtual std::unique_ptr<StageRecord> make_record() = 0;
  // Stage forward of micro-batch b. Returns the SUM of the token losses on the last stage (0
  // elsewhere, or without targets).
  virtual double forward(const StepContext& ctx, const Batch& b, StageRecord& rec) = 0;
  // Stage backward: ACCUMULATES the parameter gradients; leaves dL/d input in input_grad(rec).
  virtual void backward(StageRecord& rec, const float* dout = nullptr,
                        const BackwardPass& pass = {}) = 0;
  // The zero-bubble split of backward (Qi et al. 2024): backward_input leaves dL/d input in
  // input_grad(rec) and accumulates only the cheap parameter gradients; backward_weight later
  // accumulates the weight gradients from what the first kept in rec.
  virtual void backward_input(StageRecord& rec, const float* dout = nullptr) = 0;
  virtual void backward_weight(StageRecord& rec, const BackwardPass& pass = {}) = 0;
  virtual float* input(StageRecord& rec) = 0;
  virtual const float* output(const StageRecord& rec) const = 0;
  virtual const float* input_grad(const StageRecord& rec) const = 0;
  virtual int64_t hidden_elems(int B, int T) const = 0;

  // A second parameter set with an engine of its own (a mixture of experts' experts, whose
  // gradients are summed over another group), as a UnitModel; has_experts() says whether there is
  // one.
  virtual bool has_experts() const { return false; }
  virtual UnitModel& expert_units();

  // A record kept by the model (made on first use), so that evaluation and sampling between steps,
  // and the executor's first micro-batch, add no activation memory.
  StageRecord& shared_record();
  // The shared record if it has been made, else null.
  const StageRecord* shared_record_if_made() const { return shared_.get(); }

 private:
  std::unique_ptr<StageRecord> shared_;
};

}  // namespace tessera::nn
