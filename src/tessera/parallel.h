// tessera/parallel.h: the public API of the parallel layer (docs/API.md).
// The device Mesh, data parallelism with ZeRO 0-3, pipeline schedules as data (generators,
// validation, deadlock check, simulation), pipeline splits, per-unit timelines.
#pragma once

#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/gather.h"
#include "tessera/parallel/mesh.h"
#include "tessera/parallel/pipeline/pipeline_split.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/parallel/pipeline/schedule_deadlock.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/parallel/pipeline/schedule_simulate.h"
#include "tessera/parallel/pipeline/schedule_validate.h"
#include "tessera/parallel/pipeline/step_executor.h"
#include "tessera/parallel/rank_engines.h"
#include "tessera/parallel/unit_timeline.h"
#include "tessera/parallel/zero_stage.h"
