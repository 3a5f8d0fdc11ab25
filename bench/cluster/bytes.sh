#!/usr/bin/env bash
# Bytes between hosts per step (issue 32): dp=4 ZeRO-1, dp=4 ZeRO-3 and dp=4 ZeRO-3 HSDP by host
# (--zero-shard-group host) on the test cluster (scripts/cluster.sh, docs/CLUSTER.md; 2 hosts x 2
# ranks, links shaped to RATE), each run with one process per host of 2 thread ranks (the
# hierarchical backend, --ranks-per-process 2) and, for comparison, with one rank per process
# (flat MPI, Open MPI's own algorithms), against what `tessera plan` predicts on a two-level
# description of the cluster (plan/cross_node.h: the hierarchical backend's bytes).
# A step's bytes are the difference of two runs of STEPS1 and STEPS2 steps divided by
# STEPS2 - STEPS1, which takes out what every launch sends (mpirun's daemons, the start-up's
# collectives). The counters are the hosts' links (bytes into the hosts, summed: every byte one
# host sends the other once), so they include the Ethernet, IP and TCP headers of every packet
# (66 bytes each with TCP timestamps), the acknowledgements going the other way and MPI's own
# headers; the packet counters give the first two, and "payload" is the bytes less 66 per packet.
# Usage: bench/cluster/bytes.sh [build-dir] [RATE]   (default: build 1gbit); needs root.
# STEPS1 (default 2), STEPS2 (default 6), MODEL (default "--layers 2 --dim 256 --heads 4 --seq 64
# --vocab 512 --batch 8 --micro-batch 1": 1.73M parameters, 6.6 MiB in fp32, 2 micro-batches of
# one sequence per rank and step).
set -euo pipefail
# shellcheck source=bench/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
cluster_run_start bytes.sh tsrx 10.77.9.0/24 "$@"
steps1=${STEPS1:-2} steps2=${STEPS2:-6}
[ "$steps2" -gt "$steps1" ] || { echo "bytes.sh: STEPS2 must exceed STEPS1" >&2; exit 1; }
read -r -a model <<<"${MODEL:---layers 2 --dim 256 --heads 4 --seq 64 --vocab 512 --batch 8 --micro-batch 1}"

# Bytes and packets into the hosts (the root-side ends of the veths transmit into the hosts).
counters() {
  local b=0 p=0 i
  for i in 1 2; do
    b=$((b + $(cat "/sys/class/net/$TESSERA_CLUSTER_PREFIX-h$i/statistics/tx_bytes")))
    p=$((p + $(cat "/sys/class/net/$TESSERA_CLUSTER_PREFIX-h$i/statistics/tx_packets")))
  done
  echo "$b $p"
}
# train NAME STEPS HOSTS [train options]: one run; prints "bytes packets" into the hosts.
train() {
  local name=$1 steps=$2 hosts=$3 b0 p0 b1 p1
  shift 3
  read -r b0 p0 < <(counters)
  bash "$cluster" mpirun --host "$hosts" --bind-to none -- "$bin" train "${model[@]}" \
    --threads 1 --steps "$steps" --warmup 1 --eval-every 0 --val-fraction 0 --sample-tokens 0 \
    --comm-timeout 120 "$@" >"$out/$name.log" 2>&1 ||
    { echo "bytes.sh: the $name run failed:" >&2; grep -a "error" "$out/$name.log" | head -5 >&2; exit 1; }
  read -r b1 p1 < <(counters)
  echo "$((b1 - b0)) $((p1 - p0))"
}

# The planner, on 2 nodes x 2 devices (dev-vm's rates: only the bytes are compared here).
python3 - "$root/share/tessera/clusters/dev-vm.json" "$out/test-cluster.json" "$rate" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d.update(name=f"test-cluster-{sys.argv[3]}", nodes=2, devices_per_node=2,
         description="2 namespaces x 2 ranks (bench/cluster/bytes.sh)")
json.dump(d, open(sys.argv[2], "w"), indent=1)
PY
predict() {  # predict NAME [plan options]: bytes between the nodes per step
  local name=$1
  shift
  "$bin" plan "${model[@]}" --cluster "$out/test-cluster.json" --link mpi "$@" \
    --json "$out/plan-$name.json" >"$out/plan-$name.txt"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prediction"]["bytes_across_nodes_per_step"]["total"])' \
    "$out/plan-$name.json"
}

echo "# each run: cluster.sh mpirun --host HOSTS --bind-to none -- tessera train ${model[*]} --threads 1 --steps N ... LAYOUT;"
echo "# hierarchical: HOSTS h1:1,h2:1 and --ranks-per-process 2; flat: HOSTS h1:2,h2:2; per step: (N=$steps2 run - N=$steps1 run) / $((steps2 - steps1))"
echo "# plan: tessera plan ${model[*]} LAYOUT --cluster (dev-vm as 2 nodes x 2 devices) --json F: prediction.bytes_across_nodes_per_step.total"
echo "| layout | backend | MB into the hosts per step | packets per step | headers (66 B/packet) MB | payload MB | planned MB | measured / planned | payload / planned |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
layout() {  # layout NAME LAYOUT-OPTIONS...
  local name=$1 planned mode hosts extra b1 p1 b2 p2
  shift
  planned=$(predict "$name" "$@")
  for mode in hierarchical flat; do
    if [ "$mode" = hierarchical ]; then hosts=h1:1,h2:1 extra=(--ranks-per-process 2); else hosts=h1:2,h2:2 extra=(); fi
    read -r b1 p1 < <(train "$name-$mode-$steps1" "$steps1" "$hosts" "$@" "${extra[@]}")
    read -r b2 p2 < <(train "$name-$mode-$steps2" "$steps2" "$hosts" "$@" "${extra[@]}")
    if [ "$mode" = hierarchical ] && ! grep -q "hier backend" "$out/$name-$mode-$steps2.log"; then
      echo "bytes.sh: the $name run did not use the hierarchical backend" >&2
      exit 1
    fi
    awk -v n="$name" -v m="$mode" -v b=$((b2 - b1)) -v p=$((p2 - p1)) -v s=$((steps2 - steps1)) -v pl="$planned" 'BEGIN {
      b /= s; p /= s; h = 66 * p
      printf "| %s | %s | %.2f | %.0f | %.2f | %.2f | %.2f | %.3f (%+.1f%%) | %.3f (%+.1f%%) |\n",
        n, m, b / 1e6, p, h / 1e6, (b - h) / 1e6, pl / 1e6, b / pl, 100 * (b / pl - 1), (b - h) / pl, 100 * ((b - h) / pl - 1)
    }'
  done
}
layout "dp=4 ZeRO-1" --dp 4 --zero 1
layout "dp=4 ZeRO-3" --dp 4 --zero 3
layout "dp=4 ZeRO-3 HSDP by host" --dp 4 --zero 3 --zero-shard-group host
echo "# planned: $(grep '^bytes between' "$out/plan-dp=4 ZeRO-3.txt")  [dp=4 ZeRO-3]"
