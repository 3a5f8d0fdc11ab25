#!/usr/bin/env bash
# The full grid of the Llama family's mixtures of experts, each against one rank holding every
# expert (losses and gradient norms within 1e-5 at every step; weights within 5e-5 where a GEMM is
# split and for the experts, 1e-5 otherwise): three models (Qwen2-MoE's kind: gated shared expert,
# plain top-k gates, capacity dropping; DeepSeek's kind: sigmoid scores, ungated shared expert,
# auxiliary-loss-free balancing; Mixtral's kind, every other block MoE) x ep {1,2,4} x dp x
# ZeRO {0..3}, tp 2 (with and without sp, each recomputation) and pp 2 under every schedule at
# ep {1,2}. The suite runs a representative subset (tests/parallel/llama_moe_test.cc).
# Usage: scripts/llama_moe_grid.sh [build-dir]   (default: build)
set -euo pipefail
build="${1:-build}"
TESSERA_LLAMA_MOE_GRID=1 exec "$build/tests/parallel/test_parallel" \
  --gtest_filter='Layouts/LlamaMoeLayouts.*'
