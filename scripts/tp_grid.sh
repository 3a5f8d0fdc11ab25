#!/usr/bin/env bash
# The full tensor-parallel training-equivalence grid: tp {1,2,4} x sp {off,on} x dp {1,2} x
# ZeRO {0,1,3} (sequence parallelism where tp > 1), each against one rank (losses at every step
# and gradient norms within 1e-5, weights within 1e-5; 5e-5 at tp=4 or with dp x tp); then
# pp=2 x tp=2 --sp under every pipeline schedule, with and without full recomputation.
# Usage: scripts/tp_grid.sh [build-dir]   (default: build)
set -euo pipefail
build="${1:-build}"
TESSERA_TP_GRID=1 exec "$build/tests/parallel/test_parallel" \
  --gtest_filter='Layouts/TensorParallelTraining.*:Layouts/SequenceParallelTraining.*:SequenceParallelTraining.InsidePipelineStages'
