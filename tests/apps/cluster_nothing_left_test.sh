#!/usr/bin/env bash
# Usage: cluster_nothing_left_test.sh. Runs after the other tests of the test cluster (a CTest
# fixture's cleanup, also when one of them failed or was killed): no namespace, link or process
# of their clusters (prefixes tsrs, tsrt, tsrf) is left. Whatever is left is named, then removed,
# so that the next run starts clean; the test fails all the same.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cluster_sh="$here/../../scripts/cluster.sh"
[ "$(id -u)" = 0 ] || { echo "SKIPPED: the test cluster needs root"; exit 77; }
left=$({ ip netns list | cut -d' ' -f1; ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1; } |
  grep -E '^tsr[stf]-' | sort -u | tr '\n' ' ')
if [ -z "$left" ]; then
  echo "ok   nothing of the test clusters is left (namespaces, veths, bridges and their qdiscs)"
  exit 0
fi
echo "FAIL left behind by the cluster tests: $left"
for p in tsrs tsrt tsrf; do TESSERA_CLUSTER_PREFIX=$p bash "$cluster_sh" down; done
exit 1
