#!/usr/bin/env bash
# Usage: restart_test.sh path/to/tessera [path/to/mpiexec]. Supervised restarts (train
# --max-restarts, docs/RELIABILITY.md "Automatic restarts") end to end, on thread ranks (with
# MPIEXEC instead: a run whose attempts are mpirun jobs, so that it runs in the MPI pass):
# - faults at three random calls, one per attempt, under --max-restarts 3: the run finishes with
#   the final weights and optimizer state of a run that never failed, bit for bit;
# - a data-parallel replica lost for good (its rank exits in every attempt) under --min-dp 3: the
#   run goes on at dp 3 with the same --batch, on the loss curve of one rank;
# - an attempt that hangs (no step for --hang-timeout) is ended and restarted;
# - giving up after --max-restarts; a configuration error and a Ctrl-C are not restarted.
set -u
bin=$1
# shellcheck disable=SC2154 # dir, pass, failures: run_lib.sh
mpiexec=${2:-}
# shellcheck source=tests/apps/run_lib.sh
source "$(dirname "$0")/run_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
unset TESSERA_FAULT TESSERA_ATTEMPT TESSERA_SUPERVISED

for i in $(seq 1 200); do printf 'Line %d of a corpus for the restart tests.\n%%\n' "$i"; done >"$dir/c.txt"
common=(--data "$dir/c.txt" --cache-dir "$dir/cache" --vocab 300 --layers 2 --dim 32 --heads 2
        --seq 16 --batch 12 --micro-batch 1 --steps 12 --lr 0.01 --warmup 2 --eval-every 0
        --val-fraction 0 --sample-tokens 0 --threads 1 --comm-timeout 1 --save-every 2)
# run NAME LIMIT_S ARGS...: the command, bounded by `timeout`, output in $dir/NAME.log, status in $status.
run() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$dir/$name.log" 2>&1
  status=$?
  [ "$status" = 124 ] && fail "$name: still running after $limit s" "$dir/$name.log"
}
has() { grep -qE -- "$2" "$dir/$1.log"; }
count() { grep -cE -- "$2" "$dir/$1.log"; }
# The loss of each step (the last line for a step that was run again after a restart).
losses() { grep -oE '"loss":[^,]+|"step":[0-9]+' "$1" | paste - - | sed -E 's/"loss":([^ \t]+)\t"step":([0-9]+)/\2 \1/' |
  awk '{l[$1]=$2} END {for (s in l) print s, l[s]}' | sort -n; }
close_losses() {  # close_losses A B: every step's loss within 2e-5 (relative)
  python3 - "$1" "$2" <<'PY'
import sys
def read(p):
    out = {}
    for line in open(p):
        s, l = line.split()
        out[int(s)] = float(l)
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
bad = [s for s in b if s not in a or abs(a[s] - b[s]) > 2e-5 * abs(b[s])]
sys.exit(1 if bad or len(a) != len(b) or not a else 0)
PY
}

# The run that never fails, at dp 2, and one rank with the same batch.
run ref 60 "$bin" train "${common[@]}" --dp 2 --save "$dir/ref" --metrics "$dir/ref.jsonl"
check "reference run (dp 2)" [ "$status" = 0 ]
if [ -z "$mpiexec" ]; then
  run one 60 "$bin" train "${common[@]}" --dp 1 --metrics "$dir/one.jsonl"
  check "one-rank run" [ "$status" = 0 ]
fi

if [ -z "$mpiexec" ]; then
echo "== three faults, one per attempt, under --max-restarts 3"
# A step here makes about 5 calls per rank: calls 3 to 20 fall in the first 4 steps of an attempt,
# so each attempt fails (an attempt starts at step 10 at the latest). Drawn at random (printed).
o1=$((RANDOM % 18 + 3)) o2=$((RANDOM % 18 + 3)) o3=$((RANDOM % 18 + 3))
faults="attempt=0,rank=1,op=$o1,kind=throw;attempt=1,rank=0,op=$o2,kind=exit;attempt=2,rank=1,op=$o3,kind=delay:4s"
echo "TESSERA_FAULT=$faults"
TESSERA_FAULT=$faults run three 120 "$bin" train "${common[@]}" --dp 2 --max-restarts 3 \
  --save "$dir/three" --metrics "$dir/three.jsonl"
check "three faults: the run finishes (status 0)" [ "$status" = 0 ]
check "three faults: each attempt failed and was restarted" [ "$(count three '^tessera: restart [123] of 3')" = 3 ]
check "three faults: the failures are named" has three "attempt 2 failed at step [0-9]+ after [0-9.]+ s \(exit status 1\): .*timed out after 1000 ms"
# An attempt that failed before it trained a step is restarted after a back-off ("restart 2 of 3
# in 1 s: from ..."): with the fault drawn in the first step, as it can be, every restart says so.
check "three faults: restarts resume the newest checkpoint" has three "restart [123] of 3( in [0-9]+ s)?: from ($dir/three/step-|step 0)"
check "three faults: it says when it trained again" has three "attempt 3 is training again [0-9.]+ s after the failure"
check "three faults: it finished after 3 restarts" has three "the run finished after 3 restarts"
# An attempt that saved a checkpoint trained steps, and the supervisor says so, also when the
# attempt trained and ended between two of its polls (50 ms apart; it reads the heartbeat once more
# after the exit). The step each restart resumed from: restart_from K.
restart_from() { grep -oE "restart $1 of 3( in [0-9]+ s)?: from (step 0|[^ ]+)" "$dir/three.log" | grep -oE '[0-9]+$' | sed -E 's/^0+([0-9])/\1/'; }
trained_are_named() {
  local k prev=0 next
  for k in 1 2 3; do
    next=$(restart_from "$k")
    [ -n "$next" ] || return 1
    if [ "$next" -gt "$prev" ] && has three "attempt $((k - 1)) failed before its first step"; then return 1; fi
    prev=$next
  done
}
check "three faults: each attempt that saved a checkpoint is said to have trained" trained_are_named
for f in model.safetensors optimizer.safetensors; do
  check "three faults: the final $f is the uninterrupted run's, bit for bit" \
    cmp -s "$dir/ref/step-00000012/$f" "$dir/three/step-00000012/$f"
done

echo "== a data-parallel replica lost for good, under --min-dp 3"
TESSERA_FAULT="rank=3,op=12,kind=exit" run shrink 120 "$bin" train "${common[@]}" --dp 4 \
  --min-dp 3 --max-restarts 3 --save "$dir/shrink" --metrics "$dir/shrink.jsonl"
check "lost replica: the run finishes (status 0)" [ "$status" = 0 ]
check "lost replica: dp 4 -> 3 with --batch 12 kept" has shrink \
  "world rank 3 left in two attempts in a row: dropping 1 data-parallel replica, going on at dp 3 \(was 4; --batch 12 kept, 4 micro-batches of 1 per replica\)"
check "lost replica: the last attempt runs 3 replicas" has shrink "restart 2 of 3"
losses "$dir/shrink.jsonl" >"$dir/shrink.losses"
losses "$dir/one.jsonl" >"$dir/one.losses"
check "lost replica: the loss curve of one rank (12 steps, within 2e-5)" close_losses "$dir/shrink.losses" "$dir/one.losses"

echo "== an attempt that hangs"
# The communication deadline is long here: only the supervisor's --hang-timeout notices.
TESSERA_FAULT="attempt=0,rank=0,op=30,kind=delay:60s" run hang 120 "$bin" train "${common[@]}" \
  --dp 2 --comm-timeout 120 --hang-timeout 3 --max-restarts 1 --save "$dir/hang" \
  --metrics "$dir/hang.jsonl"
check "hang: the run finishes (status 0)" [ "$status" = 0 ]
check "hang: the supervisor ends the attempt that made no progress" has hang \
  "the attempt reported no step for 3 s \(--hang-timeout; last step [0-9]+\): ending it"
check "hang: the final weights are the uninterrupted run's" \
  cmp -s "$dir/ref/step-00000012/model.safetensors" "$dir/hang/step-00000012/model.safetensors"

echo "== giving up, configuration errors, Ctrl-C"
TESSERA_FAULT="rank=1,op=5,kind=throw" run giveup 60 "$bin" train "${common[@]}" --dp 2 \
  --max-restarts 2 --save "$dir/giveup"
check "gives up: status 1" [ "$status" = 1 ]
check "gives up after --max-restarts 2" has giveup "giving up after 2 restarts \(--max-restarts 2\)"
check "gives up: three attempts ran" [ "$(count giveup '^tessera: attempt [0-9] failed')" = 3 ]
run badcfg 30 "$bin" train "${common[@]}" --dp 2 --min-dp 3 --max-restarts 2
check "--min-dp above --dp: refused before any attempt" has badcfg "^tessera: error: --min-dp 3 is above --dp 2"
check "--min-dp above --dp: no attempt started" [ "$(count badcfg 'supervising')" = 0 ]
run nosup 30 "$bin" train "${common[@]}" --dp 2 --min-dp 1
check "--min-dp without --max-restarts: refused" has nosup "--min-dp is a setting of the supervisor: give --max-restarts N too"
run badmpirun 30 "$bin" train "${common[@]}" --dp 2 --max-restarts 1 --mpirun "no-such-mpirun -v"
check "--mpirun that is not a program: refused before any attempt" has badmpirun \
  "^tessera: error: --mpirun 'no-such-mpirun -v': 'no-such-mpirun' is not a program on PATH"
OMPI_COMM_WORLD_SIZE=2 run inmpi 30 "$bin" train "${common[@]}" --dp 2 --max-restarts 2
check "--max-restarts inside mpirun: refused, saying what to do" has inmpi \
  "max-restarts supervises the job from outside mpirun: .* give --mpirun 'mpirun OPTIONS'"
# A configuration error that only the attempt finds (too little data for --seq): not restarted.
run badresume 60 "$bin" train "${common[@]}" --seq 4096 --max-restarts 3 --save "$dir/bad"
check "an attempt's configuration error is not restarted" has badresume "not restarting: a configuration error fails again"
check "an attempt's configuration error: one attempt" [ "$(count badresume '^tessera: restart')" = 0 ]
# Ctrl-C reaches the supervisor (the attempt runs in its own process group): the attempt stops
# after its step, saves, and the supervisor ends with its status, restarting nothing.
"$bin" train "${common[@]}" --dp 2 --steps 100000 --max-restarts 3 --save "$dir/int" \
  >"$dir/int.log" 2>&1 &
sup=$!
pids+=("$sup")
for _ in $(seq 1 100); do [ -f "$dir/int/latest" ] && break; sleep 0.2; done
kill -INT "$sup"
timeout 60 tail --pid="$sup" -f /dev/null
wait "$sup"
status=$?
check "Ctrl-C: the supervisor exits 130" [ "$status" = 130 ]
check "Ctrl-C: the attempt stopped cleanly and saved" has int "stopped by SIGINT after step [0-9]+ of 100000; saved checkpoint"
check "Ctrl-C: not restarted" [ "$(count int '^tessera: restart')" = 0 ]

else
  echo "== attempts as mpirun jobs"
  TESSERA_FAULT="attempt=0,rank=1,op=20,kind=throw" run mpi 120 "$bin" train "${common[@]}" \
    --dp 2 --max-restarts 2 --mpirun "$mpiexec --oversubscribe" --save "$dir/mpi"
  check "mpirun attempts: the run finishes (status 0)" [ "$status" = 0 ]
  check "mpirun attempts: one restart" has mpi "the run finished after 1 restart"
  check "mpirun attempts: the final weights are the uninterrupted run's" \
    cmp -s "$dir/ref/step-00000012/model.safetensors" "$dir/mpi/step-00000012/model.safetensors"
fi

echo "$pass passed, $failures failed"
[ "$failures" = 0 ]
