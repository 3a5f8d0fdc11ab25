#!/usr/bin/env bash
# The longest sequence that trains a 4-layer C=256 GPT-2 (4 heads, the default corpus's vocabulary
# of 512) for one step under --memory-limit (2GiB by default) on one rank, and with the sequence
# split over context-parallel ranks (--cp 2, each --cp-comm), one sample per step. A bisection over
# sequence lengths in steps of GRAIN tokens (a multiple of 2 x cp, as --cp needs): a length that does
# not fit fails at its first allocation past the limit (fast), one that fits runs its step.
#
# Usage: bench/long_context/longest_sequence.sh [tessera]
#   env: LIMIT (2GiB), GRAIN (1024), MAX (262144), CONFIGS ("1 2:ring 2:allgather 2:ulysses"),
#        RECOMPUTE (none), MODEL (extra model flags, e.g. "--arch llama": rotary positions, so no
#        learned position table that grows with the length and is replicated on every cp rank)
# Prints per configuration the longest length that trained and the first that did not, then each
# cp configuration's ratio over one rank.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(realpath "${1:-$here/../../build/apps/tessera/tessera}")
limit=${LIMIT:-2GiB}
grain=${GRAIN:-1024}
max=${MAX:-262144}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "longest sequence under --memory-limit $limit${MODEL:+ ($MODEL)}: $(date -u +%FT%TZ)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"

fits() {  # cp comm T -> 0 when one step trains
  local cp=$1 comm=$2 T=$3 extra=()
  [ "$cp" -gt 1 ] && extra=(--cp "$cp" --cp-comm "$comm")
  # shellcheck disable=SC2086 # MODEL is a list of flags
  "$bin" train --layers 4 --dim 256 --heads 4 ${MODEL:-} --seq "$T" --batch 1 --steps 1 --warmup 0 \
    --memory-limit "$limit" --recompute "${RECOMPUTE:-none}" --val-fraction 0 --eval-every 0 \
    --sample-tokens 0 --threads 1 --cache-dir "$work/cache" "${extra[@]}" >"$work/log" 2>&1
}

declare -A longest
for c in ${CONFIGS:-1 2:ring 2:allgather 2:ulysses}; do
  cp=${c%%:*}
  comm=${c#*:}
  [ "$comm" = "$c" ] && comm=none
  lo=0 hi=$((max / grain + 1))  # in grains: lo fits (0: nothing yet), hi does not
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    if fits "$cp" "$comm" $((mid * grain)); then lo=$mid; else
      if ! grep -q "out of memory" "$work/log"; then
        echo "cp=$cp $comm T=$((mid * grain)) failed for another reason:"
        tail -3 "$work/log"
        exit 1
      fi
      hi=$mid
    fi
  done
  longest[$c]=$((lo * grain))
  label="cp=$cp"
  [ "$comm" = none ] || label="$label $comm"
  echo "$label: longest $((lo * grain)) tokens (first failing $((hi * grain)))"
done
base=${longest[1]:-0}
for c in "${!longest[@]}"; do
  [ "$c" = 1 ] || [ "$base" -eq 0 ] ||
    python3 -c "import sys; print(f'{sys.argv[1]}: {int(sys.argv[2])/int(sys.argv[3]):.2f}x one rank')" \
      "cp=${c/:/ }" "${longest[$c]}" "$base"
done
