#!/usr/bin/env bash
# Data parallelism's speed-up, measured: dp=2 (one thread per rank, both ranks threads of one
# process, ZeRO-0) against one rank with one thread, on the same global batch of BATCH (8)
# sequences of GPT L=6 C=512 heads 8 T=256 V=4096. The two runs alternate (the order flips each
# round), ROUNDS (3) times; each run's figure is its median tokens/s over the steps after the
# first, and the speed-up is the ratio within a round, reported with its median and how many
# rounds met TARGET (1.85).
# Usage: bench/parallel/dp.sh [tessera]   env: ROUNDS, STEPS (8), BATCH, ZERO (0), TARGET
# Timings want a quiet machine: run nothing else meanwhile.
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
rounds=${ROUNDS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--cache-dir "$out/cache" --vocab 4096 --val-fraction 0 --eval-every 0 --sample-tokens 0
      --layers 6 --dim 512 --heads 8 --seq 256 --batch "${BATCH:-8}" --steps "${STEPS:-8}"
      --warmup 1 --threads 1 --zero "${ZERO:-0}")
"$bin" train "${args[@]}" --steps 0 >/dev/null  # prepares the data once
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  order=(one dp2)
  [ $((r % 2)) = 0 ] && order=(dp2 one)
  for l in "${order[@]}"; do
    flags=(--dp 1)
    [ "$l" = dp2 ] && flags=(--dp 2)
    "$bin" train "${args[@]}" "${flags[@]}" --metrics "$out/$l.$r.jsonl" >"$out/$l.$r.log" 2>&1 ||
      { cat "$out/$l.$r.log"; exit 1; }
    echo "round $r $l: $(grep '^done' "$out/$l.$r.log" | head -1)"
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$rounds" "${TARGET:-1.85}" <<'PY'
import json, statistics, sys
out, rounds, target = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def tok(name):
    rows = [json.loads(x) for x in open(f"{out}/{name}.jsonl") if '"tokens_per_s"' in x]
    return statistics.median(x["tokens_per_s"] for x in rows[1:])
one = [tok(f"one.{r}") for r in range(1, rounds + 1)]
dp = [tok(f"dp2.{r}") for r in range(1, rounds + 1)]
ratios = [b / a for a, b in zip(one, dp)]
print("one rank tok/s:", " ".join(f"{x:.0f}" for x in one))
print("dp=2 tok/s:    ", " ".join(f"{x:.0f}" for x in dp))
print("speed-up:      ", " ".join(f"{x:.3f}" for x in ratios),
      f"median {statistics.median(ratios):.3f}x; >= {target}x in {sum(x >= target for x in ratios)} of {rounds}")
PY
