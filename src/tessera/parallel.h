// tessera/parallel.h: the public API of the parallel layer (docs/API.md).
// The device Mesh, data parallelism with ZeRO 0-3, pipeline schedules as data (generators,
// validation, deadlock check, simulation), pipeline splits, per-unit timelines.
#pragma once

#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/gather.h"
#include "tessera/parallel/mesh.h"
#include "tessera/parallel/pipeline_split.h"
#include "tessera/parallel/schedule.h"
#include "tessera/parallel/schedule_deadlock.h"
#include "tessera/parallel/schedule_generators.h"
#include "tessera/parallel/schedule_simulate.h"
#include "tessera/parallel/schedule_validate.h"
#include "tessera/parallel/unit_timeline.h"
