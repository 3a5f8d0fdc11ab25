#!/usr/bin/env bash
# Layouts that follow the topology (issue 32): the step time of dp=2 x tp=2 on the test cluster
# (scripts/cluster.sh, docs/CLUSTER.md; 2 hosts x 2 ranks, links shaped to RATE) placed as tessera
# and Megatron place it, each tensor-parallel pair inside a host (mpirun's default mapping, by
# slot), against the opposite placement, each pair across the link (`--map-by node`), where the
# data-parallel pairs stay inside the hosts instead; and the topology placement again as one
# process per host of 2 thread ranks (`--ranks-per-process 2`: the hierarchical backend, whose
# collectives are the hierarchical ones the planner models). The three are timed interleaved,
# ROUNDS times; the figure is each run's median step after the first 3, and the bytes that
# crossed the links.
# Beside them, what `tessera plan` predicts for the topology placement on a two-level description
# of this cluster: 2 nodes x 2 devices, each device half a core (4 ranks share the 2 cores), the
# MPI link inside a node, and between nodes RATE shared by a host's 2 ranks (latency from ping).
# The compute rates come from `tessera plan --calibrate --quick` on this machine and the link
# inside a host from the same calibration under the cluster's mpirun with both ranks in h1 (TCP,
# as the runs use), unless CALIBRATE=0, which takes dev-vm's (share/tessera/clusters/dev-vm.json).
# Usage: bench/cluster/placement.sh [build-dir] [RATE]   (default: build 1gbit); needs root.
# ROUNDS (default 3), STEPS (default 20), MODEL (default "--layers 4 --dim 256 --heads 8 --seq 256
# --vocab 512 --batch 8").
set -euo pipefail
# shellcheck source=bench/cluster/lib.sh
. "$(dirname "$0")/lib.sh"
cluster_run_start placement.sh tsrp 10.77.5.0/24 "$@"
rounds=${ROUNDS:-3} steps=${STEPS:-20}
read -r -a model <<<"${MODEL:---layers 4 --dim 256 --heads 8 --seq 256 --vocab 512 --batch 8}"

args=(train "${model[@]}" --dp 2 --tp 2 --threads 1
      --steps "$steps" --warmup 1 --eval-every 0 --val-fraction 0 --sample-tokens 0)
bytes_in() { bash "$cluster" bytes | awk '{s += $2} END {printf "%.0f\n", s}'; }
# run NAME MPIRUN-OPTIONS...: one run; prints "median_ms bytes". hosts= and extra= (one more
# train flag) in its environment change mpirun's hosts and the command.
run() {
  local name=$1 before after
  shift
  before=$(bytes_in)
  bash "$cluster" mpirun --host "${hosts:-h1:2,h2:2}" --bind-to none "$@" -- "$bin" "${args[@]}" \
    ${extra:+"$extra"} --metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1 ||
    { echo "placement.sh: the $name run failed:" >&2; grep -a "error" "$out/$name.log" | head -5 >&2; exit 1; }
  after=$(bytes_in)
  python3 - "$out/$name.jsonl" "$((after - before))" <<'PY'
import json, statistics, sys
steps = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if '"step_ms"' in l]
print(f"{statistics.median(steps[3:]):.1f} {sys.argv[2]}")
PY
}
echo "# each run: mpirun --host h1:2,h2:2 --bind-to none [--map-by node] -- tessera ${args[*]}"
echo "# a process per host: mpirun --host h1:1,h2:1 --bind-to none -- tessera ... --ranks-per-process 2"
echo "| round | by topology: step ms | MB across | opposite (--map-by node): step ms | MB across | opposite / topology | by topology, a process per host: step ms | MB across |"
echo "|---|---|---|---|---|---|---|---|"
topo=() oppo=() hier=()
for r in $(seq 1 "$rounds"); do
  read -r t tb < <(run "topology$r")
  read -r o ob < <(run "opposite$r" --map-by node)
  read -r h hb < <(hosts=h1:1,h2:1 extra=--ranks-per-process=2 run "hier$r")
  topo+=("$t") oppo+=("$o") hier+=("$h")
  awk -v r="$r" -v t="$t" -v tb="$tb" -v o="$o" -v ob="$ob" -v h="$h" -v hb="$hb" \
    'BEGIN {printf "| %d | %.1f | %.2f | %.1f | %.2f | %.2fx | %.1f | %.2f |\n", r, t, tb / 1e6, o, ob / 1e6, o / t, h, hb / 1e6}'
done
python3 - "${topo[*]}" "${oppo[*]}" <<'PY'
import statistics, sys
t = [float(x) for x in sys.argv[1].split()]
o = [float(x) for x in sys.argv[2].split()]
ratios = [b / a for a, b in zip(t, o)]
print(f"# median step: by topology {statistics.median(t):.1f} ms, opposite {statistics.median(o):.1f} ms; "
      f"opposite / topology {statistics.median(ratios):.2f}x (runs where topology was faster: "
      f"{sum(r > 1 for r in ratios)} of {len(ratios)})")
PY

# The planner, on a two-level description of this cluster.
rtt_ms=0.1  # without ping (iputils-ping), a round trip of 100 us is assumed
if command -v ping >/dev/null; then
  rtt_ms=$(bash "$cluster" exec h1 ping -c 5 -i 0.2 -q 10.77.5.2 | sed -n 's/.*= [0-9.]*\/\([0-9.]*\)\/.*/\1/p')
fi
base=$root/share/tessera/clusters/dev-vm.json
if [ "${CALIBRATE:-1}" = 1 ]; then
  base=$out/here.json
  "$bin" plan --calibrate --quick --out "$base" >/dev/null
  bash "$cluster" mpirun --host h1:2 -- "$bin" plan --calibrate --quick --out "$base" >/dev/null
  python3 - "$base" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"# calibrated here: fp32 peak {d['peak_tflops']['fp32'] * 1e3:.1f} GFLOP/s a core, MPI over "
      f"TCP inside a host {d['calibration']['mpi']['bandwidth_gbs']:.3f} GB/s")
PY
fi
python3 - "$base" "$out/test-cluster.json" "$rate" "$rtt_ms" <<'PY'
import json, re, sys
src, dst, rate, rtt = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4] or 0.1)
d = json.load(open(src))
m = re.fullmatch(r"([0-9.]+)([gm])bit", rate)
gbs = float(m.group(1)) * (1 if m.group(2) == "g" else 1e-3) / 8
ranks, cores = 4, 2
d.update(name=f"test-cluster-{rate}", nodes=2, devices_per_node=2,
         description=f"dev-vm's calibration as 2 namespaces x 2 ranks on {cores} cores, links {rate}",
         intra_node={"bandwidth_gbs": d["calibration"]["mpi"]["bandwidth_gbs"],
                     "latency_us": d["calibration"]["mpi"]["latency_us"]},
         # inter_node is per device (plan/cluster.h): the host's 2 ranks share its link.
         inter_node={"bandwidth_gbs": gbs / 2, "latency_us": rtt * 1000 / 2})
d["peak_tflops"] = {k: v * cores / ranks for k, v in d["peak_tflops"].items()}
json.dump(d, open(dst, "w"), indent=1)
PY
plan=("$bin" plan "${model[@]}" --dp 2 --tp 2 --cluster "$out/test-cluster.json" --link mpi)
echo "# ${plan[*]/$out\//}   (ping round trip ${rtt_ms} ms)"
"${plan[@]}" | grep -E "^step:|^throughput:|bytes sent" | sed 's/^/#   /'
predicted=$("${plan[@]}" --json "$out/plan.json" >/dev/null 2>&1 &&
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prediction"]["step_seconds"] * 1e3)' "$out/plan.json" || echo "")
if [ -n "$predicted" ]; then
  python3 - "$predicted" "${topo[*]}" "${hier[*]}" <<'PY'
import statistics, sys
p = float(sys.argv[1])
for what, runs in (("by topology, a process per rank (flat MPI)", sys.argv[2]),
                   ("by topology, a process per host (hierarchical)", sys.argv[3])):
    t = statistics.median(float(x) for x in runs.split())
    print(f"# planned step {p:.1f} ms against {t:.1f} ms measured {what}: {100 * (p - t) / t:+.0f}%")
PY
fi
