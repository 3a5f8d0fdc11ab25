#include "tessera/nn/stage_model.h"

#include "tessera/core/error.h"

namespace tessera::nn {

UnitModel& StageModel::expert_units() {
  TESSERA_ASSERT(has_experts(), "expert_units() of a stage without experts");
  TESSERA_ASSERT(false, "a stage with experts must override expert_units()");
}

StageRecord& StageModel::shared_record() {
  if (!shared_) shared_ = make_record();
  return *shared_;
}

}  // namespace tessera::nn
