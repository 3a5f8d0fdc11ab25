#!/usr/bin/env bash
# Runs every measurement of the Collectives section of docs/PERFORMANCE.md in one mpirun job:
#   memory bandwidth, inproc all_reduce (2 threads), MPI backend all_reduce, raw MPI_Allreduce.
# Usage: bench/comm/run.sh [build-dir] [extra bench_comm flags]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../../build}"
shift || true
bin="$build/bench/comm/bench_comm"
[[ -x "$bin" ]] || { echo "run.sh: $bin not found; build the bench_comm target first" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# --bind-to none: rank 0 runs the two inproc thread-ranks, which need both cores.
exec mpirun --oversubscribe --bind-to none -np "${NP:-2}" "$bin" "$@"
