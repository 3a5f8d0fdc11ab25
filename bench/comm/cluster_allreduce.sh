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
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(1gbit 10gbit)
bin="$build/bench/comm/bench_comm"
[ -x "$bin" ] || { echo "cluster_allreduce.sh: $bin not found; build the bench_comm target first" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "cluster_allreduce.sh: the test cluster needs root" >&2; exit 1; }
cluster=$(cd "$here/../../scripts" && pwd)/cluster.sh
export TESSERA_CLUSTER_PREFIX=tsrb
trap 'bash "$cluster" down >/dev/null 2>&1 || true' EXIT
bash "$cluster" up 2 --bandwidth "${rates[0]}" --subnet 10.77.4.0/24
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, kernel $(uname -r), $(mpirun --version | head -1)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
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
