#!/usr/bin/env bash
# Tensor parallelism, measured: tp=2 (one thread per rank) against one rank (one thread), both in
# this run, GPT L=6 C=512 heads 8 T=256 V=4096, batch 4 sequences (the same global batch: tensor
# parallelism splits each sequence's work, not the batch). Usage: bench/parallel/tp.sh [tessera]
# Timings want a quiet machine: run nothing else meanwhile.
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--cache-dir "$out/cache" --vocab 4096 --val-fraction 0 --eval-every 0 --sample-tokens 0
      --layers 6 --dim 512 --heads 8 --seq 256 --batch 4 --steps ${STEPS:-8} --warmup 1 --threads 1)
for tp in 1 2; do
  "$bin" train "${args[@]}" --tp $tp | grep "^done" | sed "s/^/tp=$tp: /" | tee "$out/tp$tp"
done
python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
tok = {}
for tp in (1, 2):
    m = re.search(r"([0-9.]+)\s*(k?)\s*tok(?:ens)?/s", open(f"{out}/tp{tp}").read())
    tok[tp] = float(m.group(1)) * (1000 if m.group(2) == "k" else 1) if m else float("nan")
print(f"tokens/s: tp=1 {tok[1]:.0f}, tp=2 {tok[2]:.0f}, speed-up {tok[2] / tok[1]:.2f}x")
PY
