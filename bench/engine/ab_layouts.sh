#!/usr/bin/env bash
# Interleaved A/B of two `tessera` binaries (builds of two commits) on the engine benchmark model,
# GPT {L=6, C=512, heads 8, T=256, V=4096}, one thread per rank, under four layouts: one rank
# (batch 4), dp=2 (batch 4, two sequences per rank), tp=2 (batch 4) and pp=2 1f1b (batch 16 in 8
# micro-batches of 2). Each round runs every layout with the old binary and then the new one
# (the order of the sides alternates between rounds), so that machine drift hits both alike. A
# run's figure is the median tokens/s of its steps after the first; the summary gives, per
# layout, the median of the per-round ratios new/old and how many rounds the new side was within
# TOLERANCE (default 3%) of the old or faster. The final losses of the two sides are printed too
# (a refactoring that keeps the numbers must agree on them to the printed digits).
#
# Usage: bench/engine/ab_layouts.sh OLD_TESSERA NEW_TESSERA [ROUNDS (3)] [STEPS (8)]
#   env: LAYOUTS ("one dp2 tp2 pp2"), TOLERANCE (0.03)
# Timings want a quiet machine: run nothing else meanwhile.
set -euo pipefail
old=${1:?usage: ab_layouts.sh OLD_TESSERA NEW_TESSERA [ROUNDS] [STEPS]}
new=${2:?usage: ab_layouts.sh OLD_TESSERA NEW_TESSERA [ROUNDS] [STEPS]}
rounds=${3:-3}
steps=${4:-8}
read -r -a layouts <<<"${LAYOUTS:-one dp2 tp2 pp2}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--cache-dir "$out/cache" --vocab 4096 --val-fraction 0 --eval-every 0 --sample-tokens 0
      --layers 6 --dim 512 --heads 8 --seq 256 --steps "$steps" --warmup 1 --threads 1
      --log-every 1)
flags_of() {
  case $1 in
    one) echo "--batch 4" ;;
    dp2) echo "--batch 4 --dp 2" ;;
    tp2) echo "--batch 4 --tp 2" ;;
    pp2) echo "--batch 16 --micro-batch 2 --pp 2 --schedule 1f1b" ;;
    *) echo "unknown layout '$1' (one, dp2, tp2, pp2)" >&2; exit 2 ;;
  esac
}
"$new" train "${args[@]}" --batch 4 --steps 0 >/dev/null  # tokenizer and token file, once
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  sides=(old new)
  [ $((r % 2)) = 0 ] && sides=(new old)
  for l in "${layouts[@]}"; do
    read -r -a flags <<<"$(flags_of "$l")"
    for side in "${sides[@]}"; do
      bin=$old
      [ "$side" = new ] && bin=$new
      log="$out/$l.$side.$r"
      "$bin" train "${args[@]}" "${flags[@]}" --metrics "$log.jsonl" >"$log.log" 2>&1 ||
        { cat "$log.log"; exit 1; }
      echo "round $r $l $side: $(grep '^done' "$log.log" | head -1) ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))"
    done
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$rounds" "${TOLERANCE:-0.03}" "${layouts[@]}" <<'PY'
import json, statistics, sys
out, rounds, tol, layouts = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]

def run(layout, side, r):
    rows = [json.loads(x) for x in open(f"{out}/{layout}.{side}.{r}.jsonl") if '"tokens_per_s"' in x]
    return statistics.median(x["tokens_per_s"] for x in rows[1:]), rows[-1].get("loss")

print(f"{'layout':8} {'old tok/s (per round)':34} {'new tok/s (per round)':34} ratio new/old  rounds within {tol:.0%}")
for l in layouts:
    o = [run(l, "old", r) for r in range(1, rounds + 1)]
    n = [run(l, "new", r) for r in range(1, rounds + 1)]
    ratios = [b[0] / a[0] for a, b in zip(o, n)]
    ok = sum(x >= 1 - tol for x in ratios)
    fmt = lambda v: " ".join(f"{x[0]:7.0f}" for x in v)
    print(f"{l:8} {fmt(o):34} {fmt(n):34} {statistics.median(ratios):6.3f}x       {ok}/{rounds}")
    losses = {(s, x[1]) for s, v in (("old", o), ("new", n)) for x in v}
    if len({x for _, x in losses}) != 1:
        print(f"         final losses differ: {sorted(losses, key=str)}")
PY
