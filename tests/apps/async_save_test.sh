#!/usr/bin/env bash
# Usage: async_save_test.sh path/to/tessera. Checkpoints written in the background (--save-async,
# docs/RELIABILITY.md), end to end, with TESSERA_SAVE_DELAY_MS making each write sleep after its
# model file so that things happen while a write is in flight:
#   * SIGKILL while a background write is in flight leaves the previous checkpoint as `latest`,
#     loadable, and resuming from it gives every loss and the final weights of the uninterrupted
#     run, bit for bit;
#   * SIGINT while a write is in flight waits for it: the run exits with 130 and both the
#     checkpoint being written and the stop's are complete; the printed resume command continues
#     to the uninterrupted run's losses;
#   * a background write that fails (RLIMIT_FSIZE: "File too large") ends the run with the save's
#     error naming the path, before the run's end, and leaves the previous checkpoint as `latest`.
set -u
bin=$1
# shellcheck source=tests/apps/run_lib.sh
source "$(dirname "$0")/run_lib.sh"
# "STEP LOSS" per step, the last logged (a resumed run logs again the steps after its checkpoint);
# the loss as the shortest text that reads back as the same double, so equal text is equal bits.
losses() {
  python3 -c 'import json, sys
last = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and "step" in r: last[r["step"]] = repr(r["loss"])
for k in sorted(last): print(k, last[k])' "$1"
}
same_losses() {
  if [ "$(losses "$1")" = "$(losses "$2")" ] && [ "$(losses "$1" | wc -l)" = "$3" ]; then return 0; fi
  diff <(losses "$1") <(losses "$2") | head -6
  return 1
}
complete() { [ -f "$1/state.json" ]; }
not_complete() { ! complete "$1"; }
no_partial() { ! compgen -G "$1/*.tmp" >/dev/null && ! compgen -G "$1/*.old" >/dev/null; }
lacks() { ! grep -q "$1" <<<"$2"; }
latest_is() { [ "$(cat "$1/latest" 2>/dev/null)" = "$2" ]; }
# wait_for FILE PID: until FILE exists (or PID ends, or 30 s pass).
wait_for() {
  local t=0
  while [ ! -e "$1" ] && kill -0 "$2" 2>/dev/null && [ $t -lt 3000 ]; do sleep 0.01; t=$((t + 1)); done
  [ -e "$1" ]
}
# finish PID SECONDS: waits for PID (killing it after SECONDS) and sets $status.
finish() {
  local t=0 hung=0
  while kill -0 "$1" 2>/dev/null && [ $t -lt $(($2 * 100)) ]; do sleep 0.01; t=$((t + 1)); done
  if kill -0 "$1" 2>/dev/null; then kill -KILL "$1"; hung=1; fi
  wait "$1"
  status=$?
  [ $hung = 0 ] || status=hung
}
loads() {  # the checkpoint's weights evaluate
  "$bin" eval --data "$dir/c.txt" --seq 16 --batch 4 --max-windows 4 --weights "$1" \
    --tokenizer "$2/tokenizer.json" >/dev/null 2>&1
}

for i in $(seq 1 200); do printf 'Line %d of a corpus for the checkpoint tests.\n%%\n' "$i"; done >"$dir/c.txt"
common=(--data "$dir/c.txt" --cache-dir "$dir/cache" --vocab 300 --layers 2 --dim 32 --heads 2
        --seq 16 --batch 8 --micro-batch 2 --lr 0.01 --warmup 2 --dropout 0.1 --eval-every 0
        --val-fraction 0 --sample-tokens 0 --threads 1 --log-every 1000)
launch=(env --default-signal=INT)

timeout 120 "$bin" train "${common[@]}" --steps 12 --save "$dir/ref" --metrics "$dir/ref.jsonl" \
  >"$dir/ref.log" 2>&1 || { cat "$dir/ref.log"; exit 1; }

echo "== SIGKILL while the write of step 4 is in flight"
run=$dir/kill
TESSERA_SAVE_DELAY_MS=3000 "$bin" train "${common[@]}" --steps 12 --save-every 2 --save-async \
  --save "$run" --metrics "$run.jsonl" >"$run.log" 2>&1 &
pid=$!
pids+=("$pid")
if wait_for "$run/step-00000004.tmp/model.safetensors" "$pid"; then
  kill -KILL "$pid"
  finish "$pid" 10
  check "kill: killed mid-write (status $status)" [ "$status" = 137 ]
  check "kill: latest is still step 2" latest_is "$run" step-00000002
  check "kill: step 2 is complete" complete "$run/step-00000002"
  check "kill: step 4 is not" not_complete "$run/step-00000004"
  check "kill: step 2's weights load" loads "$run/step-00000002" "$run"
  timeout 120 "$bin" train --resume "$run" --cache-dir "$dir/cache" >"$run.resume.log" 2>&1 &&
    grep -q "resumed from $run/step-00000002 at step 2" "$run.resume.log" &&
    grep -q "done: 12 steps" "$run.resume.log"
  check "kill: the resume from step 2 finishes" [ $? = 0 ]
  check "kill: all 12 losses equal the uninterrupted run's, bit for bit" \
    same_losses "$run.jsonl" "$dir/ref.jsonl" 12
  check "kill: the final weights equal the uninterrupted run's" \
    cmp -s "$run/model.safetensors" "$dir/ref/model.safetensors"
  check "kill: nothing partial is left" no_partial "$run"
else
  finish "$pid" 1
  fail "kill: the write of step 4 never started" "$run.log"
fi

echo "== SIGINT while the write of step 2 is in flight (--dp 2)"
timeout 120 "$bin" train "${common[@]}" --steps 40 --dp 2 --metrics "$dir/ref40.jsonl" \
  >"$dir/ref40.log" 2>&1 || { cat "$dir/ref40.log"; exit 1; }
run=$dir/int
TESSERA_SAVE_DELAY_MS=2000 "${launch[@]}" "$bin" train "${common[@]}" --steps 40 --dp 2 \
  --save-every 2 --save-async --save "$run" --metrics "$run.jsonl" >"$run.log" 2>&1 &
pid=$!
pids+=("$pid")
if wait_for "$run/step-00000002.tmp/model.safetensors" "$pid"; then
  sent=$(date +%s%N)
  kill -INT "$pid"
  finish "$pid" 30
  took_ms=$((($(date +%s%N) - sent) / 1000000))
  check "int: exits with 130" [ "$status" = 130 ]
  stopped=$(grep -oE "stopped by SIGINT after step [0-9]+ of 40; saved checkpoint $run/step-[0-9]{8}\. Resume with:" "$run.log")
  check "int: says where it stopped and what it saved" [ -n "$stopped" ]
  at=$(grep -oE "after step [0-9]+" <<<"$stopped" | grep -oE "[0-9]+")
  at_dir=$(printf 'step-%08d' "${at:-0}")
  check "int: the write in flight was waited for (${took_ms} ms after the signal)" \
    grep -q "saved checkpoint $run/step-00000002$" "$run.log"
  check "int: step 2 is complete" complete "$run/step-00000002"
  check "int: the stop's checkpoint ($at_dir) is complete" complete "$run/$at_dir"
  check "int: and latest" latest_is "$run" "$at_dir"
  check "int: step 2 loads" loads "$run/step-00000002" "$run"
  check "int: $at_dir loads" loads "$run/$at_dir" "$run"
  resume=$(grep -A1 "Resume with:" "$run.log" | tail -1 | sed 's/^  //')
  eval "timeout 120 $resume" >"$run.resume.log" 2>&1 && grep -q "done: 40 steps" "$run.resume.log"
  check "int: the printed resume command finishes the run" [ $? = 0 ]
  check "int: all 40 losses equal the uninterrupted run's, bit for bit" \
    same_losses "$run.jsonl" "$dir/ref40.jsonl" 40
else
  finish "$pid" 1
  fail "int: the write of step 2 never started" "$run.log"
fi

echo "== a background write that fails (RLIMIT_FSIZE)"
run=$dir/lim
timeout 120 "$bin" train "${common[@]}" --steps 4 --save "$run" >"$run.log" 2>&1 ||
  { cat "$run.log"; exit 1; }
limit_kb=$(($(stat -c %s "$run/step-00000004/model.safetensors") / 1024 + 8))
# shellcheck disable=SC2016 # the inner script's own arguments
out=$(timeout 120 bash -c 'trap "" XFSZ; ulimit -f "$1"; shift; exec "$@"' _ "$limit_kb" \
  "$bin" train --resume "$run" --cache-dir "$dir/cache" --steps 40 --save-every 2 --save-async 2>&1)
status=$?
check "fail: the run fails (status $status)" [ "$status" = 1 ]
check "fail: with the save's error, naming the path and the reason" \
  grep -qE "^tessera: error: could not save checkpoint step-00000006 in $run: .*$run/step-00000006.tmp/optimizer.safetensors.*File too large.*still $run/step-00000004" <<<"$out"
check "fail: before the run's end" lacks "done: 40 steps" "$out"
check "fail: latest is still step 4" latest_is "$run" step-00000004
check "fail: nothing partial is left" no_partial "$run"

echo "async save: $pass passed, $failures failed"
[ $failures -eq 0 ]
