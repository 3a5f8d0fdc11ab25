// Runs one optimizer step as a schedule (parallel/schedule.h): this rank's list of actions,
// executed in order. Forward and Backward of micro-batch m use an activation record taken from a
// pool when m's forward starts and returned when its backward ends, so a schedule decides how many
// micro-batches are in flight (and so the activation memory), not the executor.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tessera/nn/gpt.h"
#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/schedule.h"

namespace tessera::train {

class StepExecutor {
 public:
  StepExecutor(nn::GPT& model, parallel::DataParallel& engine);

  // Runs `rank`'s actions of `schedule` with the given step context. fetch(m) returns micro-batch
  // m (its buffers valid until the next fetch); optimizer_step(loss_sum) is the OptimizerStep
  // action, given the sum of the token losses this rank computed. Returns that sum.
  double run(const parallel::Schedule& schedule, int rank, const nn::StepContext& ctx,
             const std::function<nn::Batch(int)>& fetch,
             const std::function<void(double)>& optimizer_step);

  // Records allocated so far: the peak number of micro-batches in flight on this rank.
  int records_allocated() const { return static_cast<int>(pool_.size()); }

 private:
  nn::GPT::Record& acquire(int micro_batch);
  nn::GPT::Record& in_flight(int micro_batch);
  void release(int micro_batch);

  nn::GPT& model_;
  parallel::DataParallel& engine_;
  std::vector<nn::GPT::Record*> pool_;  // the model's single record first, then owned_
  std::vector<std::unique_ptr<nn::GPT::Record>> owned_;
  std::vector<int> free_;     // indices into pool_
  std::vector<int> slot_of_;  // micro-batch -> pool index, -1 when not in flight
};

}  // namespace tessera::train
