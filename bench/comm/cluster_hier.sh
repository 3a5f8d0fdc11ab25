#!/usr/bin/env bash
# Hierarchical against flat all-reduce across the hosts of the test cluster (scripts/cluster.sh,
# docs/CLUSTER.md): 2 hosts x 2 ranks, links shaped to each RATE in turn, 1-64 MiB. Flat: 4
# processes (h1:2,h2:2), one rank each, on the MPI backend (its ring below 64 MiB,
# MPI_Iallreduce at 64 MiB). Hierarchical: 2 processes (h1:1,h2:1) of 2 thread ranks each
# (--ranks-per-process 2): the ranks of a host sum in memory and the hosts exchange the buffer
# once. Both are `tessera bench-comm --ops all_reduce` (nccl-tests busbw); ROUNDS rounds
# (default 3) alternate the two, flat first, and each prints the bytes that crossed the links.
# Needs root. Usage: bench/comm/cluster_hier.sh [build-dir] [RATE...] (default: build 1gbit 10gbit)
set -euo pipefail
# shellcheck source=bench/comm/cluster_bench_lib.sh
. "$(cd "$(dirname "$0")" && pwd)/cluster_bench_lib.sh"
cluster_bench_start cluster_hier.sh tsrh 10.77.6.0/24 apps/tessera/tessera "$@"
bench=(--ops all_reduce --min-bytes 1MiB --max-bytes 64MiB --iters 8 --min-iters "${MIN_ITERS:-5}"
       --warmup 2 --no-membw --timeout-s 120)
crossed() { bash "$cluster" bytes | awk '{s += $2} END {printf "%.0f", s}'; }
for rate in "${rates[@]}"; do
  bash "$cluster" shape "$rate" >/dev/null
  for round in $(seq 1 "${ROUNDS:-3}"); do
    for kind in flat hier; do
      if [ "$kind" = flat ]; then
        cmd=(bash "$cluster" mpirun --host "h1:2,h2:2" --bind-to none -- "$bin" bench-comm "${bench[@]}")
      else
        cmd=(bash "$cluster" mpirun --host "h1:1,h2:1" --bind-to none -- "$bin" bench-comm "${bench[@]}"
             --ranks-per-process 2)
      fi
      echo
      echo "## $rate, round $round, $kind: ${cmd[*]}"
      before=$(crossed)
      "${cmd[@]}" | grep -E '^(all_reduce|# tessera)'
      echo "# $(( ($(crossed) - before) >> 20 )) MiB crossed the links into the hosts; load average $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
done
