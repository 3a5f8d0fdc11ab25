#!/usr/bin/env bash
# Interleaved A/B of two `tessera` binaries (say, builds of two commits) on the mixed-precision
# benchmark model, GPT {L=6, C=512, T=256, V=4096}, B=4, one thread: for each round, each binary
# in fp32 and then in bf16, so that machine drift hits both sides alike. Prints, per run, the
# median tokens/s of steps 3..STEPS (the first steps allocate and create primitives) and the final
# loss (the two binaries should agree on it to the printed digits unless the change is numerical).
#
# Usage: bench/precision/ab_train.sh OLD_TESSERA NEW_TESSERA [ROUNDS (3)] [STEPS (12)]
#   env: PRECISIONS ("fp32 bf16"), EXTRA (more train flags, e.g. "--bf16-gemm emulated")
# Run it from a directory where the default corpus may be cached (runs/cache).
set -euo pipefail
old=${1:?usage: ab_train.sh OLD_TESSERA NEW_TESSERA [ROUNDS] [STEPS]}
new=${2:?usage: ab_train.sh OLD_TESSERA NEW_TESSERA [ROUNDS] [STEPS]}
rounds=${3:-3}
steps=${4:-12}
read -r -a extra <<<"${EXTRA:-}"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    bin=$old
    [ "$side" = new ] && bin=$new
    for p in ${PRECISIONS:-fp32 bf16}; do
      m=$(mktemp)
      "$bin" train --layers 6 --dim 512 --heads 8 --seq 256 --vocab 4096 --batch 4 \
        --steps "$steps" --warmup 2 --threads 1 --eval-every 0 --sample-tokens 0 \
        --val-fraction 0 --log-every 1 --precision "$p" --metrics "$m" "${extra[@]}" \
        >"$m.log" 2>&1 || { cat "$m.log"; exit 1; }
      # The median tokens/s of steps 3.. and the last step's loss, from the metrics file.
      read -r median loss < <(python3 -c "import json,statistics,sys
r=[json.loads(l) for l in open(sys.argv[1]) if 'tokens_per_s' in l]
print(round(statistics.median(x['tokens_per_s'] for x in r if x['step']>=3)), '%.4f' % r[-1]['loss'])" "$m")
      rm -f "$m" "$m.log"
      echo "round $r $side $p median_tok/s $median loss $loss $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
