#!/usr/bin/env bash
# The speed targets of docs/PERFORMANCE.md ("Speed targets"), remeasured in one sitting: each
# figure by its own benchmark script, which interleaves the two sides of its ratio and says how
# many rounds met the target. Prints the machine, then each script's summary; the full output of
# each goes to OUT (default: a temporary directory, printed).
#
# Usage: bench/targets.sh [tessera]   env: ROUNDS (3), ONLY (space-separated subset of:
#   cores dp tp pp moe bf16 gpt2)
# Takes ~25 minutes on 2 cores. Timings want a quiet machine: run nothing else meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/apps/tessera/tessera}")
export ROUNDS=${ROUNDS:-3} REPEATS=${ROUNDS:-3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
unset OUT  # the sub-scripts read OUT themselves
echo "$(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc);" \
  "flags: $(grep -m1 -o -w 'avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "logs in $out"
show() {  # the summary lines of a log (none found is not an error)
  grep -iE "$2" "$out/$1.log" | head -"${3:-12}" || true
}
run() {  # name, command...: runs it, keeps its output
  local name=$1
  shift
  echo "== $name ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))"
  "$@" >"$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; return 1; }
}
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
if want cores; then run cores bash bench/parallel/cores.sh "$bin" && show cores "ceiling"; fi
if want dp; then run dp bash bench/parallel/dp.sh "$bin" && show dp "tok/s|speed-up"; fi
if want tp; then run tp bash bench/parallel/tp.sh "$bin" && show tp "^ +[0-9] |speed-up"; fi
if want pp; then run pp bash bench/parallel/pp.sh "$bin" && show pp "median|one rank:|bubble"; fi
if want moe; then run moe bash bench/parallel/moe.sh "$bin" speed && show moe "round|median|ep=2"; fi
if want bf16; then
  run bf16 bash bench/precision/ab_train.sh "$bin" "$bin" "$ROUNDS" 12 && show bf16 "round" 20
fi
if want gpt2; then
  run gpt2 env OUT="$out/gpt2-runs" bash bench/precision/gpt2_124m.sh "$bin" --threads 2 && show gpt2 "^\\||bf16/fp32"
fi
