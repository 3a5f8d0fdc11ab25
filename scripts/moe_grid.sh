#!/usr/bin/env bash
# The full mixture-of-experts training-equivalence grid: ep {1,2,4} x dp (multiples of ep up to 4)
# x ZeRO {0,1,2,3} x {dropless, capacity factor 0.75}, plus tp = 2 and pp = 2 (with recomputation)
# at ep {1,2}, dropout on, each against one rank holding every expert (losses and gradient norms
# at every step within 1e-5, weights within 1e-5).
# Usage: scripts/moe_grid.sh [build-dir]   (default: build)
set -euo pipefail
build="${1:-build}"
TESSERA_MOE_GRID=1 exec "$build/tests/parallel/test_parallel" --gtest_filter='Layouts/MoeTraining.*'
