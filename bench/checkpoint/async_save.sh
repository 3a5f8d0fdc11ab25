#!/usr/bin/env bash
# The cost of checkpointing GPT-2 124M (L=12, C=768, 12 heads, V=50257, context T) with AdamW on
# one rank with 2 compute threads: the median step time of a run that never saves, of one that
# saves synchronously every 10 steps (--save-async=false: each save blocks for the whole write)
# and of one that saves in the background every 10 steps (--save-async), the three run one after
# the other in each round (interleaved, as the machine is shared), ROUNDS rounds. Printed per
# round and overall: the medians, and async/none and sync/none (target of issue 33: async saving
# every 10 steps costs <= 5% of the step time of a run that never saves, ratio <= 1.05).
#
# The median counts every step after the first; a synchronous save falls between two steps and is
# in no step's time, so the figure that says what saving costs is the wall time per step, from the
# end of the first step to the end of the last (the final checkpoint, written in the foreground
# after the last step, is outside it): the target is checked on it.
#
# Data: the fortunes corpus's bytes as token ids in a raw uint16 file (bench/fortunes_bytes.py),
# so the model has GPT-2's vocabulary.
#
# Usage: bench/checkpoint/async_save.sh [tessera] [extra train flags...]
#   env: STEPS (25), SEQ (1024), BATCH (1), ROUNDS (1), SAVE_EVERY (10), THREADS (2),
#        OUT (logs and checkpoints; default a temporary directory, removed unless given)
set -euo pipefail
bin=${1:-build-unity/apps/tessera/tessera}
shift || true
steps=${STEPS:-25}
seq=${SEQ:-1024}
batch=${BATCH:-1}
rounds=${ROUNDS:-1}
every=${SAVE_EVERY:-10}
threads=${THREADS:-2}
keep=${OUT:+1}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -n "$keep" ] || trap 'rm -rf "$out"' EXIT
python3 "$(dirname "$0")/../fortunes_bytes.py" "$out/fortunes_bytes.bin"
args=(--data "$out/fortunes_bytes.bin" --vocab 50257 --layers 12 --dim 768 --heads 12
      --seq "$seq" --batch "$batch" --steps "$steps" --warmup 2 --val-fraction 0 --eval-every 0
      --sample-tokens 0 --threads "$threads" --log-every 1 --cache-dir "$out/cache" "$@")
echo "$(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores;" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "GPT-2 124M, T=$seq, B=$batch, $steps steps, $threads threads, saves every $every steps;" \
  "$rounds round(s)"
for r in $(seq 1 "$rounds"); do
  for v in none sync async; do
    rm -rf "$out/ckpt-$v"
    extra=()
    case $v in
      none) ;;
      sync) extra=(--save "$out/ckpt-$v" --save-every "$every" --save-async=false) ;;
      async) extra=(--save "$out/ckpt-$v" --save-every "$every" --save-async) ;;
    esac
    # Each output line with the time it came (the progress line is printed at every step's end).
    "$bin" train "${args[@]}" "${extra[@]}" --metrics "$out/$v-$r.jsonl" 2>&1 |
      python3 -u -c 'import sys, time
for l in sys.stdin: print(f"{time.time():.3f} {l}", end="", flush=True)' >"$out/$v-$r.log" ||
      { tail -20 "$out/$v-$r.log"; exit 1; }
    echo "$(date -u +%T) round $r $v done (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def run(v, r):
    rows = [json.loads(l) for l in open(f"{out}/{v}-{r}.jsonl")]
    steps = [x for x in rows if "step_ms" in x]
    med = statistics.median(x["step_ms"] for x in steps[1:]) / 1e3
    # Wall time per step from the end of step 1 to the end of the last step: the times the
    # progress lines "step N/M" came.
    ends = [float(l.split()[0]) for l in open(f"{out}/{v}-{r}.log")
            if len(l.split()) > 2 and l.split()[1] == "step" and "/" in l.split()[2]]
    wall = (ends[-1] - ends[0]) / (len(ends) - 1)
    return med, wall
met = 0
res = {v: [] for v in ("none", "sync", "async")}
print("| round | none: median step (s) | sync | async | median async/none | sync/none | wall/step none | sync | async | wall async/none | sync/none |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    m = {v: run(v, r) for v in res}
    for v in res: res[v].append(m[v])
    ok = m["async"][1] / m["none"][1] <= 1.05
    met += ok
    print(f"| {r} | {m['none'][0]:.3f} | {m['sync'][0]:.3f} | {m['async'][0]:.3f} | "
          f"{m['async'][0]/m['none'][0]:.3f} | {m['sync'][0]/m['none'][0]:.3f} | "
          f"{m['none'][1]:.3f} | {m['sync'][1]:.3f} | {m['async'][1]:.3f} | "
          f"**{m['async'][1]/m['none'][1]:.3f}** | {m['sync'][1]/m['none'][1]:.3f} |")
print(f"rounds where asynchronous saving cost <= 5% of the wall time per step: {met} of {rounds}")
PY
