// tessera/train.h: the public API of the train layer (docs/API.md).
// The training run (TrainConfig, run_training), forward through a pipeline, sampling, weights
// files, metrics, and a configuration as the planner sees it (plan_of.h).
#pragma once

#include "tessera/train/generate.h"
#include "tessera/train/metrics.h"
#include "tessera/train/model_io.h"
#include "tessera/train/pipeline_forward.h"
#include "tessera/train/plan_of.h"
#include "tessera/train/stop_request.h"
#include "tessera/train/train_config.h"
#include "tessera/train/trainer.h"
