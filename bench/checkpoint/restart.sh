#!/usr/bin/env bash
# Time from a failure to training again under the supervisor (train --max-restarts, issue 33):
# GPT-2 124M (L=12, C=768, 12 heads, V=50257, T=SEQ) with AdamW, dp 2 as threads with THREADS/2
# BLAS threads each, checkpoints every SAVE_EVERY steps in the background. After step KILL_AT the
# attempt's process is killed with SIGKILL (a crash: no error, no report), ROUNDS times in one
# run (--max-restarts ROUNDS). Printed per failure: the seconds from the attempt's end to the new
# attempt training again (it has started its process, read the data, loaded the 1.5 GB checkpoint
# and built the model), as the supervisor reports them.
#
# Data: the fortunes corpus's bytes as token ids (bench/fortunes_bytes.py).
#
# Usage: bench/checkpoint/restart.sh [tessera] [extra train flags...]
#   env: SEQ (256), STEPS (30), SAVE_EVERY (5), KILL_AT (7), ROUNDS (3), THREADS (2), OUT
set -euo pipefail
bin=$(realpath "${1:-build-unity/apps/tessera/tessera}")
shift || true
seq=${SEQ:-256}
steps=${STEPS:-30}
every=${SAVE_EVERY:-5}
kill_at=${KILL_AT:-7}
rounds=${ROUNDS:-3}
threads=${THREADS:-2}
keep=${OUT:+1}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -n "$keep" ] || trap 'rm -rf "$out"' EXIT
cp "$bin" "$out/tessera"  # the attempts start this copy: a rebuild meanwhile changes nothing
bin=$out/tessera
python3 "$(dirname "$0")/../fortunes_bytes.py" "$out/fortunes_bytes.bin"
echo "$(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores;" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "GPT-2 124M, T=$seq, dp 2 x $((threads / 2 > 0 ? threads / 2 : 1)) threads, $steps steps," \
  "saves every $every steps; SIGKILL after step $kill_at of each attempt, $rounds times"
rm -rf "$out/ckpt" "$out/kills"
"$bin" train --data "$out/fortunes_bytes.bin" --vocab 50257 --layers 12 --dim 768 --heads 12 \
  --seq "$seq" --batch 2 --micro-batch 1 --dp 2 --steps "$steps" --warmup 2 --val-fraction 0 \
  --eval-every 0 --sample-tokens 0 --threads "$((threads / 2 > 0 ? threads / 2 : 1))" \
  --log-every 1 --cache-dir "$out/cache" --save "$out/ckpt" --save-every "$every" \
  --max-restarts "$rounds" --metrics "$out/run.jsonl" "$@" >"$out/run.log" 2>&1 &
sup=$!
# Kill each attempt (the supervisor's child) once it has run kill_at steps.
killed=0
last_attempt=""
while kill -0 "$sup" 2>/dev/null && [ "$killed" -lt "$rounds" ]; do
  child=$(pgrep -P "$sup" | head -1 || true)
  if [ -n "$child" ] && [ "$child" != "$last_attempt" ]; then
    start=$(grep -cE '^step +[0-9]+/' "$out/run.log" || true)
    before=$(cat "$out/ckpt/latest" 2>/dev/null || true)
    while kill -0 "$child" 2>/dev/null; do
      n=$(grep -cE '^step +[0-9]+/' "$out/run.log" || true)
      now=$(cat "$out/ckpt/latest" 2>/dev/null || true)
      # After kill_at steps, once this attempt has published a checkpoint of its own.
      if [ $((n - start)) -ge "$kill_at" ] && [ -n "$now" ] && [ "$now" != "$before" ]; then
        kill -KILL "$child"
        date +%s.%N >>"$out/kills"
        killed=$((killed + 1))
        break
      fi
      sleep 0.05
    done
    last_attempt=$child
  fi
  sleep 0.05
done
wait "$sup"
grep -E "^tessera: (attempt|restart|the run)" "$out/run.log"
python3 - "$out" <<'PY'
import re, statistics, sys
out = sys.argv[1]
again = [float(m.group(1)) for m in re.finditer(r"training again ([0-9.]+) s after the failure",
                                                  open(f"{out}/run.log").read())]
for i, a in enumerate(again):
    print(f"failure {i + 1}: training again {a:.1f} s after the attempt ended")
if again:
    print(f"median: {statistics.median(again):.1f} s over {len(again)} failures (the supervisor "
          "notices an exit within its 50 ms poll)")
PY
