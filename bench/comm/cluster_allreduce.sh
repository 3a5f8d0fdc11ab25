#!/usr/bin/env bash
# All-reduce bus bandwidth across the hosts of the test cluster (scripts/cluster.sh,
# docs/CLUSTER.md): 2 hosts x 2 ranks, links shaped to each RATE in turn, 1-64 MiB, flat MPI --
# the MPI backend's all_reduce and raw MPI_Allreduce, timed interleaved by bench_comm --mpi-only.
# The baseline for hierarchical collectives (docs/PERFORMANCE.md, "Test cluster (network
# namespaces)"). Needs root. Prints the machine, the date, the commands, the tables, and the bytes
# that crossed the links during each table.
# Usage: bench/comm/cluster_allreduce.sh [build-dir] [RATE...]   (default: build 1gbit 10gbit)
# MIN_ITERS (default 8) sets bench_comm --min-iters.
set -euo pipefail
# shellcheck source=bench/comm/cluster_bench_lib.sh
. "$(cd "$(dirname "$0")" && pwd)/cluster_bench_lib.sh"
cluster_bench_start cluster_allreduce.sh tsrb 10.77.4.0/24 bench/comm/bench_comm "$@"
for rate in "${rates[@]}"; do
  bash "$cluster" shape "$rate" >/dev/null
  cmd=(bash "$cluster" mpirun --host "h1:2,h2:2" --bind-to none -- "$bin" --mpi-only --ops all_reduce
       --min-bytes $((1 << 20)) --max-bytes $((64 << 20)) --min-iters "${MIN_ITERS:-8}")
  echo
  echo "## links shaped to $rate: ${cmd[*]}"
  before=$(bash "$cluster" bytes | awk '{s += $2} END {printf "%.0f", s}')
  t0=$SECONDS
  "${cmd[@]}" | sed -n '/^# summary/,$p'
  after=$(bash "$cluster" bytes | awk '{s += $2} END {printf "%.0f", s}')
  echo "# $((SECONDS - t0)) s; $(( (after - before) >> 20 )) MiB crossed the links into the hosts; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
done
