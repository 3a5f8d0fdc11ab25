#!/usr/bin/env bash
# The launch agent of the test cluster (scripts/cluster.sh, docs/CLUSTER.md): Open MPI's mpirun
# calls it as it would call ssh (`--mca plm_rsh_agent scripts/cluster_agent.sh`, which
# `cluster.sh mpirun` sets): options, then the host, then the command line of the remote daemon.
# It skips the options, maps the host to its network namespace (h2, tsr-h2 or 10.77.0.2 ->
# tsr-h2 with the default prefix) and runs the command there through /bin/sh, in a UTS namespace
# of its own whose host name is the host's name as mpirun knows it, so that MPI_Get_processor_name
# (and the errors that name a peer's host) tell the hosts apart. The environment passes through
# as it is: mpirun's, which is where TESSERA_* settings come from.
# TESSERA_CLUSTER_PREFIX (default tsr) selects the cluster, as for cluster.sh.
set -u
prefix=${TESSERA_CLUSTER_PREFIX:-tsr}
# ssh options; those of ssh's that take an argument skip it too.
while [ $# -gt 0 ]; do
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "cluster_agent: usage: cluster_agent.sh [ssh options] HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
case $host in
  "$prefix"-*) ns=$host ;;
  *.*.*.*)  # an address of the cluster's subnet: host i has .i
    ns="$prefix-h${host##*.}" ;;
  *) ns="$prefix-$host" ;;
esac
if ! ip netns list 2>/dev/null | cut -d' ' -f1 | grep -qx -- "$ns"; then
  echo "cluster_agent: no host '$host' (network namespace $ns) in the test cluster '$prefix';" \
    "hosts: $(ip netns list 2>/dev/null | cut -d' ' -f1 | grep -- "^$prefix-" | sort -V | tr '\n' ' ')" >&2
  exit 255
fi
name=${ns#"$prefix"-}
# shellcheck disable=SC2016  # $0 and $1 are expanded by the inner shell
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' \
  "$name" "$*"
