#!/usr/bin/env bash
# How long idle OpenMP threads spin, measured: GPT-2 124M (B4 T64, --threads 2) in bf16 (oneDNN's
# GEMMs run on libgomp's threads) and fp32, under libgomp's default spin (300000), tessera's
# (10000, kernels/blas_setup.h) and OMP_WAIT_POLICY=PASSIVE, interleaved ROUNDS (3) times; each
# run's figure is its median step after the first. Run it once on a quiet machine and once beside
# other work (LOAD=1 starts two busy loops for the whole run) to see both sides of the trade.
# Usage: bench/precision/openmp_spin.sh [tessera]
set -euo pipefail
bin=$(realpath "${1:-build/apps/tessera/tessera}")
out=$(mktemp -d)
trap 'rm -rf "$out"; [ -n "${loops:-}" ] && kill $loops 2>/dev/null || true' EXIT
python3 - /usr/share/games/fortunes "$out/tokens.bin" <<'PY'
import array, os, sys
data = b"".join(open(os.path.join(sys.argv[1], n), "rb").read() for n in sorted(os.listdir(sys.argv[1]))
                if os.path.isfile(os.path.join(sys.argv[1], n)) and "." not in n)
array.array("H", data).tofile(open(sys.argv[2], "wb"))
PY
loops=
if [ "${LOAD:-0}" = 1 ]; then
  (while :; do :; done) & loops="$loops $!"
  (while :; do :; done) & loops="$loops $!"
fi
for r in $(seq 1 "${ROUNDS:-3}"); do
  for setting in GOMP_SPINCOUNT=300000 GOMP_SPINCOUNT=10000 OMP_WAIT_POLICY=PASSIVE; do
    for p in bf16 fp32; do
      env "$setting" "$bin" train --data "$out/tokens.bin" --vocab 50257 --layers 12 --dim 768 \
        --heads 12 --seq 64 --batch 4 --steps 5 --warmup 1 --val-fraction 0 --eval-every 0 \
        --sample-tokens 0 --cache-dir "$out/cache" --threads 2 --precision "$p" \
        --metrics "$out/m.jsonl" >/dev/null 2>&1
      med=$(python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1]) if 'step_ms' in l]; print(round(statistics.median(x['step_ms'] for x in r[1:])))" "$out/m.jsonl")
      echo "round $r $setting $p $med ms/step (load $(cut -d' ' -f1 /proc/loadavg))"
      rm -f "$out/m.jsonl"
    done
  done
done
