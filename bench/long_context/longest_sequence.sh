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
#        learned position table that grows with the length and is replicated on every cp rank),
#        FLAGS (extra flags for the cp configurations, e.g. "--zero 1": ZeRO shards over the
#        gradient group, dp x cp), GUESS (a length to start from: the search gallops up or down
#        from it in grains before bisecting, two or three steps when the guess is close),
#        BASE (one rank's longest, from an earlier run: the ratios without measuring it again)
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
echo "longest sequence under --memory-limit $limit${MODEL:+ ($MODEL)}${FLAGS:+ (cp: $FLAGS)}:" \
  "$(date -u +%FT%TZ)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"

fits() {  # cp comm T -> 0 when one step trains
  local cp=$1 comm=$2 T=$3 extra=()
  # shellcheck disable=SC2206 # FLAGS is a list of flags
  [ "$cp" -gt 1 ] && extra=(--cp "$cp" --cp-comm "$comm" ${FLAGS:-})
  # shellcheck disable=SC2086 # MODEL is a list of flags
  "$bin" train --layers 4 --dim 256 --heads 4 ${MODEL:-} --seq "$T" --batch 1 --steps 1 --warmup 0 \
    --memory-limit "$limit" --recompute "${RECOMPUTE:-none}" --val-fraction 0 --eval-every 0 \
    --sample-tokens 0 --threads 1 --cache-dir "$work/cache" "${extra[@]}" >"$work/log" 2>&1
}

probe() {  # cp comm grains -> 0 when that many grains train; stops on any failure but memory
  if fits "$1" "$2" $(($3 * grain)); then return 0; fi
  if ! grep -q "out of memory" "$work/log"; then
    echo "cp=$1 $2 T=$(($3 * grain)) failed for another reason:"
    tail -3 "$work/log"
    exit 1
  fi
  return 1
}

declare -A longest
for c in ${CONFIGS:-1 2:ring 2:allgather 2:ulysses}; do
  cp=${c%%:*}
  comm=${c#*:}
  [ "$comm" = "$c" ] && comm=none
  lo=0 hi=$((max / grain + 1))  # in grains: lo fits (0: nothing yet), hi does not
  if [ -n "${GUESS:-}" ]; then  # gallop from the guess until a fitting and a failing length
    g=$((GUESS / grain)) step=1
    if probe "$cp" "$comm" "$g"; then
      lo=$g
      while [ $((lo + step)) -lt "$hi" ] && probe "$cp" "$comm" $((lo + step)); do
        lo=$((lo + step)) step=$((step * 2))
      done
      [ $((lo + step)) -lt "$hi" ] && hi=$((lo + step))
    else
      hi=$g
      while [ $((hi - step)) -gt 0 ] && ! probe "$cp" "$comm" $((hi - step)); do
        hi=$((hi - step)) step=$((step * 2))
      done
      [ $((hi - step)) -gt 0 ] && lo=$((hi - step))
    fi
  fi
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    if probe "$cp" "$comm" "$mid"; then lo=$mid; else hi=$mid; fi
  done
  longest[$c]=$((lo * grain))
  label="cp=$cp"
  [ "$comm" = none ] || label="$label $comm"
  echo "$label: longest $((lo * grain)) tokens (first failing $((hi * grain)))"
done
base=${longest[1]:-${BASE:-0}}
for c in "${!longest[@]}"; do
  [ "$c" = 1 ] || [ "$base" -eq 0 ] ||
    python3 -c "import sys; print(f'{sys.argv[1]}: {int(sys.argv[2])/int(sys.argv[3]):.2f}x one rank')" \
      "cp=${c/:/ }" "${longest[$c]}" "$base"
done
