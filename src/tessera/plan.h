// tessera/plan.h: the public API of the plan layer (docs/PLANNER.md).
// Cluster descriptions, the model and layout a plan is made for, the engines' memory and time
// accounting, ranking of layouts, reports and calibration of a machine.
#pragma once

#include "tessera/plan/calibrate.h"
#include "tessera/plan/cluster.h"
#include "tessera/plan/collectives.h"
#include "tessera/plan/engine.h"
#include "tessera/plan/korthikanti.h"
#include "tessera/plan/layout.h"
#include "tessera/plan/model_spec.h"
#include "tessera/plan/planner.h"
#include "tessera/plan/report.h"
#include "tessera/plan/work.h"
