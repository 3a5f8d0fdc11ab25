# shellcheck shell=bash
# Sourced by the benchmarks on the test cluster (bench/comm/cluster_*.sh): their common start.
# cluster_bench_start SCRIPT PREFIX SUBNET BINARY [build-dir] [RATE...] checks that
# BUILD/BINARY exists and that we are root, brings up a cluster of 2 hosts called PREFIX on
# SUBNET (removed again when the script exits), and prints the machine. It sets `build`, `bin`,
# `cluster` (scripts/cluster.sh) and `rates` (default 1gbit 10gbit).
cluster_bench_start() {
  local script=$1 prefix=$2 subnet=$3 binary=$4 lib_dir
  shift 4
  lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  build=$(cd "${1:-$lib_dir/../../build}" && pwd)
  shift || true
  rates=("$@")
  [ ${#rates[@]} -gt 0 ] || rates=(1gbit 10gbit)
  bin="$build/$binary"
  [ -x "$bin" ] || { echo "$script: $bin not found; build it first" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "$script: the test cluster needs root" >&2; exit 1; }
  cluster=$(cd "$lib_dir/../../scripts" && pwd)/cluster.sh
  export TESSERA_CLUSTER_PREFIX=$prefix
  trap 'bash "$cluster" down >/dev/null 2>&1 || true' EXIT
  bash "$cluster" up 2 --bandwidth "${rates[0]}" --subnet "$subnet"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, kernel $(uname -r), $(mpirun --version | head -1)"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
}
