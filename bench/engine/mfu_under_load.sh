#!/usr/bin/env bash
# MFU as two tessera builds print it: the default model, 2 threads, 8 steps, on a quiet machine and
# beside two busy loops (one per core). Usage: bench/engine/mfu_under_load.sh OLD_TESSERA NEW_TESSERA
set -u
old=${1:?usage: mfu_under_load.sh OLD_TESSERA NEW_TESSERA}
new=${2:?usage: mfu_under_load.sh OLD_TESSERA NEW_TESSERA}
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
for load in quiet busy; do
  for side in old new; do
    bin=$old; [ $side = new ] && bin=$new
    pids=()
    if [ $load = busy ]; then (while :; do :; done) & pids+=($!); (while :; do :; done) & pids+=($!); fi
    out=$($bin train --steps 8 --threads 2 --eval-every 0 --sample-tokens 0 --log-every 1 --cache-dir "$cache" 2>&1)
    for p in "${pids[@]}"; do kill "$p"; wait "$p" 2>/dev/null; done
    mfu=$(grep -o "MFU [0-9.]*%" <<<"$out" | awk '{print $2}' | tr '\n' ' ')
    peak=$(grep -o "MFU against [0-9.]*GFLOP/s" <<<"$out")
    echo "$load $side: $peak; MFU per step: $mfu"
  done
done
