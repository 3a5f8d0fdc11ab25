#!/usr/bin/env bash
# Context parallelism's speed-up: tokens/s of --cp 2 (two ranks of one thread each, every
# --cp-comm) over one rank of one thread, on a 4-layer C=256 GPT-2 (4 heads) at T = 8192, one
# sequence per step, the configurations interleaved in each round so that machine drift hits them
# alike. Prints each run's median tokens/s over the steps after the first, then per round and
# variant the ratio over that round's one-rank run.
#
# Usage: bench/long_context/cp_speed.sh [tessera]
#   env: SEQ (8192), ROUNDS (3), STEPS (4), VARIANTS ("allgather ring ulysses")
# Wants a quiet machine with at least 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(realpath "${1:-$here/../../build/apps/tessera/tessera}")
seq_len=${SEQ:-8192}
rounds=${ROUNDS:-3}
steps=${STEPS:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "cp speed, T=$seq_len: $(date -u +%FT%TZ)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"

run() {  # [train flags...] -> median tokens/s of steps 2..
  local m="$work/metrics.jsonl"
  rm -f "$m"
  "$bin" train --layers 4 --dim 256 --heads 4 --seq "$seq_len" --batch 1 --steps "$steps" \
    --warmup 1 --threads 1 --val-fraction 0 --eval-every 0 --sample-tokens 0 --log-every 1 \
    --metrics "$m" --cache-dir "$work/cache" "$@" >"$work/log" 2>&1 ||
    { cat "$work/log"; exit 1; }
  python3 -c "import json,statistics,sys
r=[json.loads(l) for l in open(sys.argv[1]) if 'tokens_per_s' in l]
print(round(statistics.median(x['tokens_per_s'] for x in r if x['step']>=2)))" "$m"
}

declare -A ratios
for r in $(seq 1 "$rounds"); do
  one=$(run)
  echo "round $r: one rank $one tokens/s"
  for v in ${VARIANTS:-allgather ring ulysses}; do
    two=$(run --cp 2 --cp-comm "$v")
    ratio=$(python3 -c "import sys; print(f'{int(sys.argv[1])/int(sys.argv[2]):.2f}')" "$two" "$one")
    echo "round $r: cp=2 $v $two tokens/s = ${ratio}x"
    ratios[$v]="${ratios[$v]:-} $ratio"
  done
done
for v in ${VARIANTS:-allgather ring ulysses}; do
  # shellcheck disable=SC2086 # ratios[v] holds one ratio per round, one argument each
  python3 -c "import statistics,sys
x=[float(a) for a in sys.argv[2:]]
print(f'{sys.argv[1]}: median {statistics.median(x):.2f}x over one rank (rounds: {\" \".join(sys.argv[2:])}); {sum(a >= 1.8 for a in x)} of {len(x)} at >= 1.8x')" \
    "$v" ${ratios[$v]}
done
