#include "tessera/train/step_executor.h"

#include "tessera/core/error.h"

namespace tessera::train {

using parallel::ActionKind;

StepExecutor::StepExecutor(nn::GPT& model, parallel::DataParallel& engine)
    : model_(model), engine_(engine) {}

nn::GPT::Record& StepExecutor::acquire(int m) {
  if (static_cast<int>(slot_of_.size()) <= m) slot_of_.resize(m + 1, -1);
  TESSERA_ASSERT(slot_of_[m] < 0, "micro-batch ", m, " is already in flight");
  if (free_.empty()) {
    if (pool_.empty()) {
      pool_.push_back(&model_.single_record());
    } else {
      owned_.push_back(model_.make_record());
      pool_.push_back(owned_.back().get());
    }
    free_.push_back(static_cast<int>(pool_.size()) - 1);
  }
  slot_of_[m] = free_.back();
  free_.pop_back();
  return *pool_[slot_of_[m]];
}

nn::GPT::Record& StepExecutor::in_flight(int m) {
  TESSERA_ASSERT(m < static_cast<int>(slot_of_.size()) && slot_of_[m] >= 0, "micro-batch ", m,
                 " has no forward in flight");
  return *pool_[slot_of_[m]];
}

void StepExecutor::release(int m) {
  free_.push_back(slot_of_[m]);
  slot_of_[m] = -1;
}

double StepExecutor::run(const parallel::Schedule& schedule, int rank, const nn::StepContext& ctx,
                         const std::function<nn::Batch(int)>& fetch,
                         const std::function<void(double)>& optimizer_step) {
  TESSERA_ASSERT(rank >= 0 && rank < static_cast<int>(schedule.ranks.size()), "rank ", rank,
                 " is not in the schedule");
  double loss_sum = 0;
  const int last = schedule.micro_batches - 1;
  for (const parallel::Action& a : schedule.ranks[rank]) {
    switch (a.kind) {
      case ActionKind::Forward: {
        nn::GPT::Record& rec = acquire(a.micro_batch);
        loss_sum += model_.forward(ctx, fetch(a.micro_batch), rec);
        break;
      }
      case ActionKind::Backward:
        // The data-parallel engine reduces during the backward of the last micro-batch (ZeRO-2/3
        // in every one).
        engine_.begin_micro_batch(a.micro_batch == last);
        model_.backward(in_flight(a.micro_batch));
        release(a.micro_batch);
        break;
      case ActionKind::ReduceGradients:
        engine_.end_backward();
        break;
      case ActionKind::OptimizerStep:
        optimizer_step(loss_sum);
        break;
      default:
        TESSERA_ASSERT(false, "action ", parallel::to_string(a),
                       " needs the pipeline executor (one stage runs F, B, reduce and step)");
    }
  }
  return loss_sum;
}

}  // namespace tessera::train
