#!/usr/bin/env bash
# Usage: stop_test.sh path/to/tessera [path/to/mpiexec]. A clean stop (docs/RELIABILITY.md):
# SIGINT or SIGTERM during training finishes the current step, saves a checkpoint, exits with
# 128 + the signal number and prints the exact command that resumes; running that command
# continues to the losses of a run that was never stopped, bit for bit. A second signal ends the
# process at once, even while a step is stuck. Threads without MPIEXEC; with it, the processes of
# an mpirun job instead, which agree on the step to stop after.
set -u
bin=$1
mpiexec=${2:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# shellcheck source=tests/apps/run_lib.sh
source "$(dirname "$0")/run_lib.sh"
# "STEP LOSS" per logged step, in the order logged (the metrics' keys are sorted: "loss" comes
# before "step"); the loss as the shortest text that reads back as the same double.
losses() {
  python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and "step" in r: print(r["step"], repr(r["loss"]))' "$1"
}
steps_logged() { local n; n=$(grep -c '"loss":' "$1" 2>/dev/null); echo "${n:-0}"; }
# wait_for_steps FILE N PID: until FILE logs N training steps (or PID ends, or 30 s pass).
wait_for_steps() {
  local t=0
  while [ "$(steps_logged "$1")" -lt "$2" ] && kill -0 "$3" 2>/dev/null && [ $t -lt 3000 ]; do
    sleep 0.01
    t=$((t + 1))
  done
}
# finish PID SECONDS: waits for PID (killing it after SECONDS) and sets $status.
finish() {
  local t=0 hung=0 rc
  while kill -0 "$1" 2>/dev/null && [ $t -lt $(($2 * 100)) ]; do sleep 0.01; t=$((t + 1)); done
  if kill -0 "$1" 2>/dev/null; then
    kill -KILL "$1"
    hung=1
  fi
  wait "$1"
  rc=$?
  status=$rc
  [ $hung = 0 ] || status=hung
}

for i in $(seq 1 200); do printf 'Line %d of a corpus for the stop tests.\n%%\n' "$i"; done >"$dir/c.txt"
common=(--data "$dir/c.txt" --cache-dir "$dir/cache" --vocab 300 --layers 2 --dim 32 --heads 2
        --seq 16 --batch 8 --micro-batch 2 --steps 120 --lr 0.01 --warmup 2 --dropout 0.1
        --eval-every 0 --val-fraction 0 --sample-tokens 0 --threads 1 --log-every 1000)
# A script's background jobs start with SIGINT ignored (and tessera keeps it so): run them with
# the default disposition, as a command typed at a terminal gets.
launch=(env --default-signal=INT)
# stop_and_resume NAME SIGNAL TARGET REFERENCE LAUNCH...: trains, sends SIGNAL once at least 3
# steps are logged to TARGET (self: the process; rank1: only the process of MPI rank 1),
# checks the stop, runs the resume command it printed and compares every step's loss with those
# of REFERENCE (the metrics of the same run, never stopped).
stop_and_resume() {
  local name=$1 sig=$2 target=$3 ref=$4
  shift 4
  local run=$dir/$name
  "${launch[@]}" "$@" "${common[@]}" --save "$run" --metrics "$run.jsonl" >"$run.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  wait_for_steps "$run.jsonl" 3 "$pid"
  if [ "$target" = rank1 ]; then  # rank 0, which saves and reports, is never signalled
    local child
    for child in $(ps -o pid= --ppid "$pid"); do
      tr '\0' '\n' <"/proc/$child/environ" | grep -qx OMPI_COMM_WORLD_RANK=1 && kill -"$sig" "$child"
    done
  else
    kill -"$sig" "$pid"
  fi
  finish "$pid" 30
  local want=$((128 + $(kill -l "$sig")))
  if [ "$1" = "$mpiexec" ]; then
    # mpirun reports the ranks' status as it sees fit (Open MPI: non-zero); the ranks' own
    # status is checked through the message.
    [ "$status" != 0 ] && [ "$status" != hung ] && ok "$name: mpirun ends non-zero ($status)" ||
      { fail "$name: status $status" "$run.log"; return; }
  else
    [ "$status" = "$want" ] && ok "$name: exits with $want after SIG$sig" ||
      { fail "$name: status $status, wanted $want" "$run.log"; return; }
  fi
  local stopped
  stopped=$(grep -oE "stopped by SIG$sig after step [0-9]+ of 120; saved checkpoint $run/step-[0-9]{8}\. Resume with:" "$run.log")
  [ -n "$stopped" ] && ok "$name: says where it stopped and that it saved" ||
    { fail "$name: no stop message" "$run.log"; return; }
  local at
  at=$(grep -oE "after step [0-9]+" <<<"$stopped" | grep -oE "[0-9]+")
  [ "$at" -lt 120 ] && [ "$(cat "$run/latest")" = "$(printf 'step-%08d' "$at")" ] &&
    ok "$name: stopped after step $at with its checkpoint as latest" ||
    fail "$name: latest is $(cat "$run/latest" 2>/dev/null), stopped after step $at"
  [ "$(steps_logged "$run.jsonl")" = "$at" ] && ok "$name: finished the step it was in" ||
    fail "$name: $(steps_logged "$run.jsonl") steps logged, stopped after $at"
  local resume
  resume=$(grep -A1 "Resume with:" "$run.log" | tail -1 | sed 's/^  //')
  [ -n "$resume" ] || { fail "$name: no resume command" "$run.log"; return; }
  echo "     resuming with: $resume"
  eval "timeout 120 $resume" >"$run.resume.log" 2>&1 && grep -q "done: 120 steps" "$run.resume.log" &&
    ok "$name: the printed resume command finishes the run" ||
    { fail "$name: resuming" "$run.resume.log"; return; }
  if [ "$(losses "$ref" | wc -l)" = 120 ] && [ "$(losses "$run.jsonl")" = "$(losses "$ref")" ]; then
    ok "$name: all 120 losses equal the uninterrupted run's, bit for bit"
  else
    fail "$name: losses differ from the uninterrupted run"
    diff <(losses "$run.jsonl") <(losses "$ref") | head -6
  fi
}

if [ -z "$mpiexec" ]; then
timeout 120 "$bin" train "${common[@]}" --dp 2 --zero 1 --metrics "$dir/ref.jsonl" >"$dir/ref.log" 2>&1 ||
  { cat "$dir/ref.log"; exit 1; }
echo "== threads: --dp 2 --zero 1"
stop_and_resume threads-int INT self "$dir/ref.jsonl" "$bin" train --dp 2 --zero 1
stop_and_resume threads-term TERM self "$dir/ref.jsonl" "$bin" train --dp 2 --zero 1

# Without --save the run stops the same way and says it cannot be resumed.
"${launch[@]}" "$bin" train "${common[@]}" --dp 2 --metrics "$dir/nosave.jsonl" >"$dir/nosave.log" 2>&1 &
pid=$!
pids+=("$pid")
wait_for_steps "$dir/nosave.jsonl" 2 "$pid"
kill -INT "$pid"
finish "$pid" 30
[ "$status" = 130 ] && grep -qE "stopped by SIGINT after step [0-9]+ of 120; nothing was saved \(no --save was given\), so it cannot be resumed" "$dir/nosave.log" &&
  ok "no --save: stops, says nothing was saved" || fail "no --save: status $status" "$dir/nosave.log"

# A second signal ends the process at once, even inside a step that would take 20 s more.
TESSERA_FAULT="rank=0,op=30,kind=delay:20s" "${launch[@]}" "$bin" train "${common[@]}" --dp 2 --comm-timeout 60 \
  --save "$dir/twice" --metrics "$dir/twice.jsonl" >"$dir/twice.log" 2>&1 &
pid=$!
pids+=("$pid")
t=0
while ! grep -q "delaying it by 20000 ms" "$dir/twice.log" && kill -0 "$pid" 2>/dev/null && [ $t -lt 3000 ]; do
  sleep 0.01
  t=$((t + 1))
done
kill -INT "$pid"
sleep 0.3
kill -0 "$pid" 2>/dev/null && ok "second signal: the first one waits for the step" ||
  fail "second signal: the first signal ended the run" "$dir/twice.log"
t0=$SECONDS
kill -INT "$pid"
finish "$pid" 5
[ "$status" = 130 ] && [ $((SECONDS - t0)) -le 2 ] && grep -q "second signal: stopping at once" "$dir/twice.log" &&
  ! grep -q "saved checkpoint" "$dir/twice.log" &&
  ok "second signal: ends the process at once (status $status)" ||
  fail "second signal: status $status after $((SECONDS - t0)) s" "$dir/twice.log"

else
  # Open MPI's mpirun forwards SIGUSR1 to every rank at once (SIGINT and SIGTERM sent to mpirun
  # reach the ranks only as SIGTERM shortly before SIGKILL: docs/RELIABILITY.md).
  echo "== mpirun -n 2: --dp 2 --zero 1"
  mpirun2=("$mpiexec" --oversubscribe -n 2 "$bin" train --dp 2 --zero 1)
  timeout 120 "${mpirun2[@]}" "${common[@]}" --metrics "$dir/mref.jsonl" >"$dir/mref.log" 2>&1 ||
    { cat "$dir/mref.log"; exit 1; }
  stop_and_resume mpi-usr1 USR1 self "$dir/mref.jsonl" "${mpirun2[@]}"
  # SIGTERM to one rank alone: the ranks agree to stop after the same step all the same.
  stop_and_resume mpi-term-rank1 TERM rank1 "$dir/mref.jsonl" "${mpirun2[@]}"
fi
echo "stop: $pass passed, $failures failed"
[ $failures -eq 0 ]
