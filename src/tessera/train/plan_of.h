// The model, layout and engine options a `tessera train` configuration describes, so that a plan
// and a run can be compared key for key (`tessera plan --config`, the Python package's
// tessera.plan(config=...)). It lives in the train layer, not in the planner, so that the planner
// (plan/) does not depend on the trainer (train/).
#pragma once

#include "tessera/plan/engine.h"
#include "tessera/plan/layout.h"
#include "tessera/plan/model_spec.h"
#include "tessera/train/train_config.h"

namespace tessera::plan {

// layers, dim, heads (0: 4), seq, vocab (the BPE size trained on text), dropout.
ModelSpec model_of(const train::TrainConfig& c);
// dp, tp, pp, ep, cp, cp_comm, sp, zero, schedule, virtual_stages, micro_batch (0: batch / dp),
// recompute.
Layout layout_of(const train::TrainConfig& c);
// bucket_mb, optimizer, and the bytes per element of the traffic that may travel in bf16.
EngineOptions engine_options_of(const train::TrainConfig& c);

}  // namespace tessera::plan
