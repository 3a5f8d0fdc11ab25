# shellcheck shell=bash
# Sourced by the benchmarks of bench/cluster/: their common start.
# cluster_run_start SCRIPT PREFIX SUBNET [build-dir] [RATE] checks that the build's `tessera` exists
# and that we are root, brings up a test cluster of 2 hosts called PREFIX on SUBNET with links
# shaped to RATE (default 1gbit), removed with the temporary folder `out` when the script exits,
# and prints the machine. It sets root, build, rate, bin (the command), cluster (scripts/cluster.sh)
# and out.
cluster_run_start() {
  local script=$1 prefix=$2 subnet=$3
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  build=$(cd "${4:-$root/build}" && pwd)
  rate=${5:-1gbit}
  bin=$build/apps/tessera/tessera
  [ -x "$bin" ] || { echo "$script: $bin not found; build the tessera target first" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "$script: the test cluster needs root" >&2; exit 1; }
  cluster=$root/scripts/cluster.sh
  export TESSERA_CLUSTER_PREFIX=$prefix
  out=$(mktemp -d)
  trap 'bash "$cluster" down >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
  bash "$cluster" up 2 --bandwidth "$rate" --subnet "$subnet" >/dev/null
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; links $rate; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
}
