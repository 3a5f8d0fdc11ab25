#!/usr/bin/env bash
# The planner against measured runs on this machine (issue 13, docs/PLANNER.md): for layouts
# mixing dp, tp, pp, ZeRO, schedules and recomputation, train a few steps and compare the median
# step time and every rank's allocator peak with `tessera plan`'s prediction for the same config.
# Usage: bench/plan/validate.sh [path/to/tessera] [cluster]. Without a cluster description it
# first calibrates this machine (`tessera plan --calibrate`) so that the rates and the runs are
# measured under the same conditions. One BLAS thread per rank; ranks beyond the cores time-share
# them (--oversubscribe). Timings want a quiet machine. LAYERS, DIM, HEADS, SEQ, VOCAB change the
# model (default L=4 C=256 heads=4 T=128 V=512; HEADS=8 gives heads of 32); ONLY=REGEX runs the
# layouts whose names match.
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
steps=${STEPS:-10}
layers=${LAYERS:-4} dim=${DIM:-256} heads=${HEADS:-4} seq=${SEQ:-128} vocab=${VOCAB:-512}
only=${ONLY:-.}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cluster=${2:-}
if [ -z "$cluster" ]; then
  cluster=$out/cluster.json
  "$bin" plan --calibrate --out "$cluster" | grep -E "^sgemm|^wrote"
fi
uptime
# name dp tp pp zero schedule virtual_stages micro_batch recompute
layouts=(
  "1-rank          1 1 1 0 1f1b 1 0 none"
  "1-rank-select   1 1 1 0 1f1b 1 4 selective"
  "1-rank-full     1 1 1 0 1f1b 1 4 full"
  "dp2             2 1 1 0 1f1b 1 0 none"
  "dp2-zero1       2 1 1 1 1f1b 1 0 none"
  "dp2-zero2       2 1 1 2 1f1b 1 2 none"
  "dp2-zero3       2 1 1 3 1f1b 1 0 none"
  "tp2             1 2 1 0 1f1b 1 0 none"
  "pp2-gpipe       1 1 2 0 gpipe 1 2 none"
  "pp2-1f1b        1 1 2 0 1f1b 1 1 none"
  "pp2-1f1b-full   1 1 2 0 1f1b 1 1 full"
  "pp2-interleaved 1 1 2 0 interleaved 2 2 none"
  "pp2-zb-h1       1 1 2 0 zb-h1 1 1 selective"
  "dp2-tp2-zero1   2 2 1 1 1f1b 1 0 none"
)
printf '%-16s %10s %10s %8s %10s %8s %12s %12s %8s\n' layout "step ms" planned error \
  "cpu ms" error "peak MiB" planned error
first=1
cores=$(nproc)
for row in "${layouts[@]}"; do
  read -r name dp tp pp zero sched v mb rc <<<"$row"
  [[ $name =~ $only ]] || continue
  cfg="$out/$name.json"
  cat >"$cfg" <<JSON
{"layers": $layers, "dim": $dim, "heads": $heads, "seq": $seq, "vocab": $vocab, "batch": 8,
 "steps": $steps,
 "warmup": 1, "dp": $dp, "tp": $tp, "pp": $pp, "zero": $zero, "schedule": "$sched",
 "virtual_stages": $v, "micro_batch": $mb, "recompute": "$rc", "threads": 1,
 "val_fraction": 0, "eval_every": 0, "sample_tokens": 0, "bucket_mb": 2,
 "cache_dir": "$out/cache", "metrics": "$out/$name.jsonl"}
JSON
  if [ $first = 1 ]; then  # prepare the tokenizer and token cache outside the timed runs
    "$bin" train --config "$cfg" --steps 1 --metrics "" >/dev/null 2>&1
    first=0
  fi
  /usr/bin/time -f "%U %S" -o "$out/$name.time" "$bin" train --config "$cfg" >"$out/$name.log" 2>&1
  "$bin" plan --config "$cfg" --cluster "$cluster" --oversubscribe --json "$out/$name.plan.json" \
    >/dev/null
  python3 - "$out" "$name" "$((dp * tp * pp))" "$steps" "$cores" <<'PY'
import json, math, re, statistics, sys
out, name = sys.argv[1], sys.argv[2]
ranks, steps, cores = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
# CPU time per step and rank (user + system of the whole run / steps / ranks): the time a rank
# would take on a core of its own, whatever other tenants of the machine do; it also counts
# the first step, start-up, and spinning while waiting for peers, not sleeping while waiting.
# With more ranks than cores it is compared with the plan's time before time-sharing.
user, system = map(float, open(f"{out}/{name}.time").read().split()[-2:])
cpu = (user + system) / steps / ranks
share = math.ceil(ranks / cores)
steps = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"step_ms"' in l]
measured = statistics.median(s["step_ms"] for s in steps[1:]) / 1e3  # the first step allocates
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
peaks = [float(v) * units[u] for v, u in re.findall(r"memory: rank \d+: peak ([0-9.]+) ([KMG]?i?B)",
                                                     open(f"{out}/{name}.log").read())]
plan = json.load(open(f"{out}/{name}.plan.json"))["prediction"]
planned = plan["step_seconds"]
planned_peak = max(r["total"] for r in plan["pipeline_ranks"])
print(f"{name:<16} {measured*1e3:10.1f} {planned*1e3:10.1f} {100*(planned/measured-1):+7.1f}% "
      f"{cpu*1e3:10.1f} {100*(planned/share/cpu-1):+7.1f}% "
      f"{max(peaks)/2**20:12.2f} {planned_peak/2**20:12.2f} {100*(planned_peak/max(peaks)-1):+7.1f}%")
PY
done
uptime
