#!/usr/bin/env bash
# The full Llama-family layout-equivalence grid, each against one rank (losses and gradient norms
# within 1e-5 at every step, weights within 5e-5): tied and untied heads x tp {1,2} x sp x
# dp {1,2} x ZeRO {0..3} x recomputation {none, selective, full}, and pp=2 under every schedule
# at tp {1,2}. The suite runs a representative subset (tests/parallel/llama_layouts_test.cc).
# Usage: scripts/llama_grid.sh [build-dir]   (default: build)
set -euo pipefail
build="${1:-build}"
TESSERA_LLAMA_GRID=1 exec "$build/tests/parallel/test_parallel" --gtest_filter='Layouts/LlamaLayouts.*'
