#!/usr/bin/env bash
# The seed's pros-and-cons table, measured (issue 13): one model trained on this machine under
# each method and a few mixes, beside the planner's prediction for the same config, written to
# docs/METHODS.md with SVG charts (docs/methods/*.svg) by the methods_report tool.
# Usage: bench/methods/run.sh [build dir] [cluster]   (defaults: build, dev-vm)
# Methods whose flags this build's `tessera train` lacks (--sp, --ep / --moe-experts while those
# branches are unmerged) are listed as "not available in this build"; rerun after merging.
# One BLAS thread per rank; ranks beyond the cores time-share them. Figures want a quiet machine.
set -euo pipefail
build=${1:-build}
cluster=${2:-dev-vm}
bin=$build/apps/tessera/tessera
report=$build/bench/methods/methods_report
steps=${STEPS:-10}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
help=$("$bin" train --help)
has() { grep -q -- "$1" <<<"$help"; }

# name | group | train flags (on top of the shared model)
methods=(
  "one rank|baseline|"
  "dp=2|data parallel|--dp 2"
  "dp=2 ZeRO-1|data parallel|--dp 2 --zero 1"
  "dp=2 ZeRO-2|data parallel|--dp 2 --zero 2"
  "dp=2 ZeRO-3|data parallel|--dp 2 --zero 3"
  "dp=4 ZeRO-3|data parallel|--dp 4 --zero 3"
  "tp=2|tensor parallel|--tp 2"
  "tp=2 + sp|tensor parallel|--tp 2 --sp"
  "pp=2 gpipe|pipeline|--pp 2 --schedule gpipe --micro-batch 1"
  "pp=2 1f1b|pipeline|--pp 2 --schedule 1f1b --micro-batch 1"
  "pp=2 interleaved v=2|pipeline|--pp 2 --schedule interleaved --virtual-stages 2 --micro-batch 1"
  "pp=2 zb-h1|pipeline|--pp 2 --schedule zb-h1 --micro-batch 1"
  "recompute selective|recomputation|--recompute selective"
  "recompute full|recomputation|--recompute full"
  "pp=2 1f1b + full recompute|recomputation|--pp 2 --schedule 1f1b --micro-batch 1 --recompute full"
  "dp=2 tp=2 pp=2 (3D)|hybrid|--dp 2 --tp 2 --pp 2 --zero 1 --micro-batch 1"
  "MoE 4 experts, ep=2|mixture of experts|--dp 2 --ep 2 --moe-experts 4 --moe-top-k 2"
  "dp=4 ZeRO-3, shard groups of 2 (HSDP)|data parallel|--dp 4 --zero 3 --zero-shard-group 2"
  "cp=2 all-gather|context parallel|--cp 2 --cp-comm allgather --micro-batch 1"
  "cp=2 ring|context parallel|--cp 2 --cp-comm ring --micro-batch 1"
  "cp=2 ulysses|context parallel|--cp 2 --cp-comm ulysses --micro-batch 1"
  "Llama, one rank|model family|--arch llama --kv-heads 2"
  "Llama, dp=2 tp=2 ZeRO-1|model family|--arch llama --kv-heads 2 --dp 2 --tp 2 --zero 1"
)
model=(--layers 4 --dim 256 --heads 8 --seq 128 --vocab 512 --batch 8)
run=(--steps "$steps" --warmup 1 --threads 1 --val-fraction 0 --eval-every 0 --sample-tokens 0
     --bucket-mb 2 --cache-dir "$out/cache")

results="$out/results.jsonl"
: >"$results"
i=0
for m in "${methods[@]}"; do
  IFS='|' read -r name group flags <<<"$m"
  i=$((i + 1))
  read -r -a extra <<<"$flags"
  available=1
  missing=""
  for f in "${extra[@]}"; do
    case $f in
      --*) has "$f " || has "$f," || { available=0; missing="$missing $f"; } ;;
    esac
  done
  echo "== $i. $name ${missing:+(not available in this build:$missing)}"
  log="$out/m$i.log" metrics="$out/m$i.jsonl" plan="$out/m$i.plan.json"
  if [ $available = 1 ]; then
    "$bin" train "${model[@]}" "${run[@]}" "${extra[@]}" --metrics "$metrics" >"$log" 2>&1 ||
      { echo "   train failed:"; tail -5 "$log"; available=0; missing=" (train failed)"; }
  fi
  # The planner takes train's flags (and knows --sp, --ep, --moe-* already).
  "$bin" plan "${model[@]}" --dp 1 "${extra[@]}" --cluster "$cluster" --oversubscribe \
    --bucket-mb 2 --json "$plan" >"$out/m$i.plan.txt" 2>&1 || echo "   plan failed: $(tail -1 "$out/m$i.plan.txt")"
  python3 - "$name" "$group" "$flags" "$available" "$missing" "$log" "$metrics" "$plan" >>"$results" <<'PY'
import json, os, re, statistics, sys
name, group, flags, available, missing, log, metrics, plan = sys.argv[1:]
row = {"name": name, "group": group, "flags": flags, "available": available == "1",
       "missing": missing.strip()}
if row["available"] and os.path.exists(metrics):
    steps = [json.loads(l) for l in open(metrics) if '"step_ms"' in l]
    text = open(log).read()
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    peaks = [float(v) * units[u] for v, u in
             re.findall(r"memory: rank \d+: peak ([0-9.]+) ([KMG]?i?B)", text)]
    step = statistics.median(s["step_ms"] for s in steps[1:]) / 1e3
    bubbles = [float(b) / 100 for b in re.findall(r"\d+: ([0-9.]+)% \(\d+ micro-batches", text)]
    row["measured"] = {"step_seconds": step, "tokens_per_second": 8 * 128 / step,
                       "memory_peaks": peaks, "memory_peak": max(peaks),
                       # comm_bytes_per_rank is data- plus tensor-parallel bytes
                       "dp_bytes_per_step": steps[-1].get("comm_bytes_per_rank", 0)
                                            - steps[-1].get("tp_bytes_per_rank", 0),
                       "tp_bytes_per_step": steps[-1].get("tp_bytes_per_rank", 0),
                       "pp_bytes_per_step": steps[-1].get("pp_bytes_per_rank", 0),
                       "bubble": statistics.mean(bubbles) if bubbles else None}
if os.path.exists(plan):
    row["predicted"] = json.load(open(plan))["prediction"]
print(json.dumps(row))
PY
done

host=$(hostname) cores=$(nproc)
python3 - "$results" "$out/results.json" "$cluster" "$host" "$cores" "$steps" "$(uptime)" <<'PY'
import datetime, json, sys
src, dst, cluster, host, cores, steps, load = sys.argv[1:]
rows = [json.loads(l) for l in open(src)]
json.dump({"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "host": host,
           "cores": int(cores), "cluster": cluster, "steps": int(steps), "load": load.strip(),
           "model": "GPT L=4 C=256 heads=8 T=128 V=512 (fortunes), batch 8 sequences",
           "methods": rows}, open(dst, "w"), indent=1)
PY
mkdir -p docs/methods
"$report" "$out/results.json" docs/METHODS.md docs/methods
cp "$out/results.json" docs/methods/results.json
echo "wrote docs/METHODS.md, docs/methods/*.svg and docs/methods/results.json (logs in $out)"
