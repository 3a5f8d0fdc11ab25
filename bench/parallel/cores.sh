#!/usr/bin/env bash
# What two ranks can gain on this machine at all: one training run alone against two identical,
# independent runs at once (one BLAS thread each, no communication between them). The sum of the
# two concurrent runs' tokens/s over the lone run's is the ceiling of any 2-rank speed-up here
# (dp, tp, pp, ep): on two dedicated cores it is 2.0; shared caches, memory bandwidth and a
# hypervisor that does not always give the guest its second vCPU lower it. The two sides
# alternate, ROUNDS times (default 3); each run's figure is its median step.
# Usage: bench/parallel/cores.sh [path/to/tessera]   env: ROUNDS (3), STEPS (8), MODEL
# Model: the tensor-parallel benchmark's (GPT L=6 C=512 heads 8 T=256 V=4096, batch 4), or
# MODEL="<train flags>" for another (e.g. the MoE benchmark's, bench/parallel/moe.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build/apps/tessera/tessera}
rounds=${ROUNDS:-3}
steps=${STEPS:-8}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=(${MODEL:---layers 6 --dim 512 --heads 8 --seq 256 --batch 4})
args=(--cache-dir "$out/cache" --vocab 4096 --val-fraction 0 --eval-every 0 --sample-tokens 0
      "${model[@]}" --steps "$steps" --warmup 1 --threads 1)
"$bin" train "${args[@]}" --steps 0 >/dev/null  # prepares the data once
median_tokens() {  # median tokens/s over the steps of a metrics file, the first step excluded
  python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
print(statistics.median(r["tokens_per_s"] for r in rows[1:]))
PY
}
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
ratios=()
for r in $(seq 1 "$rounds"); do
  "$bin" train "${args[@]}" --metrics "$out/alone.$r.jsonl" >/dev/null 2>&1
  "$bin" train "${args[@]}" --metrics "$out/a.$r.jsonl" >/dev/null 2>&1 &
  pa=$!
  "$bin" train "${args[@]}" --metrics "$out/b.$r.jsonl" >/dev/null 2>&1
  wait "$pa"
  alone=$(median_tokens "$out/alone.$r.jsonl")
  a=$(median_tokens "$out/a.$r.jsonl")
  b=$(median_tokens "$out/b.$r.jsonl")
  ratio=$(python3 -c "print(f'{($a + $b) / $alone:.2f}')")
  ratios+=("$ratio")
  printf 'round %d: alone %.0f tokens/s; together %.0f + %.0f; ceiling %sx\n' "$r" "$alone" "$a" "$b" \
    "$ratio"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 -c "import statistics,sys; print(f'median ceiling of a 2-rank speed-up: {statistics.median(map(float, sys.argv[1:])):.2f}x')" \
  "${ratios[@]}"
