#!/usr/bin/env bash
# Usage: fault_test.sh path/to/tessera [path/to/mpiexec]. Injected communication faults
# (TESSERA_FAULT, docs/RELIABILITY.md) while training with data, tensor and pipeline parallelism,
# end to end: every rank ends within the deadline (--comm-timeout 1) with an error naming the
# call, the communicator and the ranks involved; nothing hangs; the last complete checkpoint
# stays loadable and resumes to the losses of a run that never failed. Threads (inproc) without
# MPIEXEC; with it, the same under mpirun instead: a process that exits is noticed by mpirun at
# once; with orte_abort_on_non_zero_status 0 every survivor times out on its own, naming its
# call.
set -u
bin=$1
mpiexec=${2:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
pass=0
out=""
took=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
fail() { echo "FAIL $1"; [ -n "${2:-}" ] && echo "$2" | tail -25; failures=$((failures + 1)); }
# run NAME SECONDS_AT_MOST ENV_FAULT -- command...: runs it (bounded by `timeout`), leaves the
# output in $out and the status in $status; fails NAME when it hangs or takes too long.
run() {
  local name=$1 limit=$2 fault=$3
  shift 4
  local t0=$SECONDS
  if [ -n "$fault" ]; then
    out=$(TESSERA_FAULT="$fault" timeout 60 "$@" 2>&1)
  else
    out=$(timeout 60 "$@" 2>&1)
  fi
  status=$?
  took=$((SECONDS - t0))
  if [ "$status" = 124 ]; then fail "$name: hung (killed after 60 s)" "$out"; return 1; fi
  if [ "$took" -gt "$limit" ]; then fail "$name: took ${took} s (at most ${limit} s)" "$out"; return 1; fi
  return 0
}
expect_status() { [ "$status" = "$2" ] && ok "$1: status $2" || fail "$1: status $status, wanted $2" "$out"; }
expect_text() {  # expect_text NAME PATTERN [COUNT]: PATTERN (ERE) on at least COUNT lines
  local n
  n=$(grep -cE -- "$2" <<<"$out")
  [ "$n" -ge "${3:-1}" ] && ok "$1" || fail "$1: '$2' on $n lines, wanted ${3:-1}" "$out"
}
loss_at() { grep '"loss":' "$1" | grep "\"step\":$2," | tail -1 | grep -oE '"loss":[^,]+'; }
# latest_loads DIR NAME [close]: the checkpoint `latest` names is complete and resumes (as threads)
# to the reference's step-8 loss: bit for bit, or within 1e-5 when it was saved by another layout.
latest_loads() {
  local d=$1 name=$2 how=${3:-exact} latest a b
  latest=$(cat "$d/latest" 2>/dev/null)
  [ -n "$latest" ] && [ -f "$d/$latest/state.json" ] || { fail "$name: no complete checkpoint in $d"; return; }
  ok "$name: latest is $latest"
  run "$name resume" 30 "" -- "$bin" train --resume "$d" --backend inproc --metrics "$d.resumed.jsonl" || return
  a=$(loss_at "$d.resumed.jsonl" 8 | cut -d: -f2) b=$(loss_at "$dir/ref.jsonl" 8 | cut -d: -f2)
  if [ "$status" = 0 ] && grep -q "resumed from $d/$latest" <<<"$out" && [ -n "$a" ] &&
     { [ "$a" = "$b" ] || { [ "$how" = close ] &&
       python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-5 * abs(b))" "$a" "$b"; }; }; then
    ok "$name: $latest resumes to the reference's step-8 loss ($how)"
  else
    fail "$name: resuming $latest" "$out"
  fi
}

for i in $(seq 1 200); do printf 'Line %d of a corpus for the fault tests.\n%%\n' "$i"; done >"$dir/c.txt"
common=(--data "$dir/c.txt" --cache-dir "$dir/cache" --vocab 300 --layers 2 --dim 32 --heads 2
        --seq 16 --batch 8 --micro-batch 2 --steps 8 --lr 0.01 --warmup 2 --eval-every 0
        --val-fraction 0 --sample-tokens 0 --threads 1 --comm-timeout 1)
# pp=2 x dp=2 x tp=2: world rank = (pp_rank * 2 + dp_rank) * 2 + tp_rank.
layout=(--pp 2 --dp 2 --tp 2 --zero 1)
run reference 60 "" -- "$bin" train "${common[@]}" "${layout[@]}" --backend inproc \
  --metrics "$dir/ref.jsonl" --save "$dir/ref" --save-every 2
expect_status "reference (pp=2 dp=2 tp=2 threads)" 0

if [ -z "$mpiexec" ]; then
echo "== threads (inproc): pp=2 x dp=2 x tp=2"
# A malformed switch is refused before any work.
run "bad TESSERA_FAULT" 10 "rank=1,op=0,kind=throw" -- "$bin" train "${common[@]}" "${layout[@]}"
expect_status "bad TESSERA_FAULT" 1
expect_text "bad TESSERA_FAULT: says what is wrong and the format" \
  "^tessera: error: TESSERA_FAULT='rank=1,op=0,kind=throw': op must be a call number counted from 1, got '0'; the format is rank=R,op=N,kind="
! grep -qE "^(data|model):" <<<"$out" && ok "bad TESSERA_FAULT: before any work" ||
  fail "bad TESSERA_FAULT: work was done" "$out"
# A delay within the deadline only slows the run: the same losses.
run "delay 300ms" 30 "rank=5,op=40,kind=delay:300ms" -- "$bin" train "${common[@]}" "${layout[@]}" \
  --backend inproc --metrics "$dir/delay.jsonl"
expect_status "delay within the deadline" 0
expect_text "delay within the deadline: the fault fired" "TESSERA_FAULT=rank=5,op=40,kind=delay:300ms fires on world rank 5 at its call 40, .* on communicator '[a-z]+(\[[0-9,.]+\])?' rank [0-9]/[0-9]: delaying it by 300 ms"
[ "$(loss_at "$dir/delay.jsonl" 8)" = "$(loss_at "$dir/ref.jsonl" 8)" ] &&
  ok "delay within the deadline: the same step-8 loss" || fail "delay: losses differ"

# Past the deadline: the peers time out naming the late rank, every rank stops, the late rank's
# sleep ends with the world.
run "delay 30s" 10 "rank=3,op=2,comm=tp,call=all_reduce,kind=delay:30s" -- "$bin" train \
  "${common[@]}" "${layout[@]}" --backend inproc --save "$dir/t-delay" --save-every 2
expect_status "delay past the deadline" 1
expect_text "delay past the deadline: a rank times out first" \
  "^tessera: error: .* on communicator '[a-z]+\[[0-9,.]+\]' rank [0-9]/2: timed out after 1000 ms waiting for rank [01]"
expect_text "delay past the deadline: the late rank stops at its call" \
  "^rank 3 stopped: all_reduce #[0-9]+ \(F32 x [0-9]+, sum\) on communicator 'tp\[2,3\]' rank 1/2 (not run|aborted)"
expect_text "delay past the deadline: every rank stops with the call and communicator" \
  "^rank [0-7] stopped: .* on communicator '[a-z]+(\[[0-9,.]+\])?' rank [0-9]/[0-9]" 8

# A rank that throws in the data-parallel reduction (ZeRO-1 reduce-scatter of step 3): every
# rank fails at once quoting it; step 2 is the last checkpoint and it resumes.
run "throw" 10 "rank=6,op=3,comm=dp,call=reduce_scatter,kind=throw" -- "$bin" train "${common[@]}" \
  "${layout[@]}" --backend inproc --save "$dir/t-throw" --save-every 2
expect_status "throw" 1
expect_text "throw: the rank's error names its call" \
  "^rank 6 stopped: reduce_scatter #[0-9]+ .* on communicator 'dp\[4,6\]' rank 1/2: injected fault \(TESSERA_FAULT=rank=6,op=3,comm=dp,call=reduce_scatter,kind=throw\) on world rank 6"
expect_text "throw: the others fail quoting it" \
  "^rank [0-57] stopped: .*rank 1 of communicator 'dp\[4,6\]' \(world rank 6\) failed" 7
latest_loads "$dir/t-throw" "throw"

# A pipeline rank that exits before sending an activation of step 3: the next stage, blocked in
# recv, fails at once naming it.
run "exit" 10 "rank=1,op=5,comm=pp,call=send,kind=exit" -- "$bin" train "${common[@]}" \
  "${layout[@]}" --backend inproc --save "$dir/t-exit" --save-every 2
expect_status "exit" 1
expect_text "exit: the rank leaves at its send" \
  "^rank 1 stopped: send \(F32 x [0-9]+, tag [0-9]+, to rank 1\) on communicator 'pp\[1,5\]' rank 0/2: world rank 1 exited here"
# The next stage names it in its own words, or quotes the first rank that did (which of its
# peers notices first depends on timing).
expect_text "exit: the receiving stage fails naming it" \
  "^rank 5 stopped: .*(on communicator 'pp\[1,5\]' rank 1/2: rank 0 returned from its function without sending|rank [01] \(world rank 1\) returned from its function without completing this call)"
expect_text "exit: the error printed is the exit" "^tessera: error: send .* world rank 1 exited here"
latest_loads "$dir/t-exit" "exit"

# A slow checkpoint (a large one on slow storage): rank 0 reaches the barrier after its save of
# step 2 late (with --save-async, the default, the barrier before the save of step 4, where rank 0
# has waited for step 2's background write). The others wait for it under --io-timeout, not --comm-timeout, and the run goes on;
# with --io-timeout 1 the wait fails naming the checkpoint and the option, and step 2 resumes.
slow="rank=0,op=2,comm=world,call=barrier,kind=delay:2500ms"
run "slow save" 30 "$slow" -- "$bin" train "${common[@]}" "${layout[@]}" --backend inproc \
  --metrics "$dir/slow.jsonl" --save "$dir/t-slow" --save-every 2
expect_status "slow save (2.5 s against --comm-timeout 1)" 0
expect_text "slow save: rank 0 was late at the barrier after the checkpoint" \
  "TESSERA_FAULT=$slow fires on world rank 0 at its call 2, barrier #[0-9]+ on communicator 'world' rank 0/8: delaying it by 2500 ms"
[ "$(loss_at "$dir/slow.jsonl" 8)" = "$(loss_at "$dir/ref.jsonl" 8)" ] &&
  ok "slow save: the same step-8 loss" || fail "slow save: losses differ"
run "slow save past --io-timeout" 10 "$slow" -- "$bin" train "${common[@]}" "${layout[@]}" \
  --backend inproc --save "$dir/t-slow-io" --save-every 2 --io-timeout 1
expect_status "slow save past --io-timeout" 1
expect_text "slow save past --io-timeout: the error names the checkpoint and the option" \
  "^tessera: error: barrier #[0-9]+ on communicator 'world' rank [1-7]/8: timed out after 1000 ms waiting for rank 0 to arrive \(rank 0 was writing checkpoint step 2 to '.*t-slow-io'( in the background)?: --io-timeout bounds that wait, 1 s\)"
latest_loads "$dir/t-slow-io" "slow save past --io-timeout"

# A rank that calls another collective: the fingerprint check stops the whole group.
run "mismatch" 10 "rank=2,op=3,comm=tp,kind=mismatch" -- "$bin" train "${common[@]}" "${layout[@]}" \
  --backend inproc
expect_status "mismatch" 1
expect_text "mismatch: both ranks of the group name who called what" \
  "^rank [23] stopped: collective mismatch on communicator 'tp\[2,3\]' rank [01]/2: rank 0 called barrier #[0-9]+; rank 1 called all_reduce #[0-9]+ \(F32 x [0-9]+, sum\)" 2

else
  echo "== mpirun: pp=2 x dp=2 (4 processes)"
  mlayout=(--pp 2 --dp 2 --zero 1)
  # mpirun's default: the first process that fails ends the job.
  run "mpi exit" 20 "rank=2,op=5,kind=exit" -- "$mpiexec" --oversubscribe -n 4 "$bin" train \
    "${common[@]}" "${mlayout[@]}" --save "$dir/m-exit" --save-every 2
  [ "$status" != 0 ] && ok "mpi exit: non-zero status ($status)" || fail "mpi exit: status 0" "$out"
  expect_text "mpi exit: the process says where it left" \
    "^tessera: .* on communicator '[a-z]+(\[[0-9,.]+\])?' rank [0-9]/[0-9]: world rank 2 exited here"
  # Survivors left to themselves: each ends within its deadline with its own error; the stage
  # blocked in recv of the exited rank's activation names it.
  noabort=(--mca orte_abort_on_non_zero_status 0)
  run "mpi exit, no abort" 20 "rank=1,op=5,comm=pp,call=send,kind=exit" -- "$mpiexec" \
    "${noabort[@]}" --oversubscribe -n 4 "$bin" train "${common[@]}" "${mlayout[@]}" \
    --save "$dir/m-noabort" --save-every 2
  expect_text "mpi exit, no abort: the next stage's recv times out naming the exited rank" \
    "^tessera: error: recv \(F32 x [0-9]+, tag [0-9]+, from rank 0\) on communicator 'pp\[1,3\]' rank 1/2: timed out after 1000 ms waiting for rank 0 to send"
  expect_text "mpi exit, no abort: every survivor ends with an error naming a call" \
    "^tessera: error: .* on communicator '[a-z]+(\[[0-9,.]+\])?' rank [0-9]/[0-9]: timed out after 1000 ms" 3
  latest_loads "$dir/m-noabort" "mpi exit, no abort" close
  run "mpi throw, no abort" 20 "rank=3,op=2,comm=dp,call=reduce_scatter,kind=throw" -- "$mpiexec" \
    "${noabort[@]}" --oversubscribe -n 4 "$bin" train "${common[@]}" "${mlayout[@]}" \
    --save "$dir/m-throw" --save-every 2
  expect_text "mpi throw: the rank's error names its call" \
    "^tessera: error: reduce_scatter #[0-9]+ .* on communicator 'dp\[2,3\]' rank 1/2: injected fault"
  expect_text "mpi throw: the other ranks end within their deadline" \
    "^tessera: error: .* on communicator '[a-z]+(\[[0-9,.]+\])?' rank [0-9]/[0-9]: timed out after 1000 ms" 3
  run "mpi mismatch" 20 "rank=0,op=4,comm=dp,kind=mismatch" -- "$mpiexec" "${noabort[@]}" \
    --oversubscribe -n 4 "$bin" train "${common[@]}" "${mlayout[@]}"
  expect_text "mpi mismatch: both ranks of the group name who called what" \
    "^tessera: error: collective mismatch on communicator 'dp\[0,1\]' rank [01]/2: rank 0 called barrier #[0-9]+; rank 1 called [a-z_]+ #[0-9]+" 2
  # Rank 0's barriers on 'world' under mpirun: 1 its data ready, 2 every rank's, 3 --save made,
  # 4 the wait for step 2's checkpoint (written in the background) before the save of step 4.
  run "mpi slow save" 30 "rank=0,op=4,comm=world,call=barrier,kind=delay:2500ms" -- "$mpiexec" \
    --oversubscribe -n 4 "$bin" train "${common[@]}" "${mlayout[@]}" --save "$dir/m-slow" --save-every 2
  expect_status "mpi slow save: the others wait for the checkpoint under --io-timeout" 0
  # Rank 1 slow to start (reading a large checkpoint or corpus): the others, ready, wait for it
  # under --io-timeout too.
  run "mpi slow start" 30 "rank=1,op=2,comm=world,call=barrier,kind=delay:2500ms" -- \
    "$mpiexec" --oversubscribe -n 4 "$bin" train "${common[@]}" "${mlayout[@]}"
  expect_status "mpi slow start: the others wait for a rank still reading under --io-timeout" 0
  expect_text "mpi slow start: rank 1 was late at the start-up barrier" \
    "fires on world rank 1 at its call 2, barrier #[0-9]+ on communicator 'world'"
  # Rank 1's third call is the start-up broadcast: its peers time out in the split that follows,
  # after their parts of its handshake were posted, so rank 1 gets through the handshake late and
  # its blocking MPI_Comm_split is ended by the watchdog (before it, the rank hung there).
  run "mpi delay, no abort" 20 "rank=1,op=3,kind=delay:4s" -- "$mpiexec" "${noabort[@]}" \
    --oversubscribe -n 4 "$bin" train "${common[@]}" "${mlayout[@]}"
  expect_text "mpi delay: the peers, then the late rank, time out" \
    "^tessera: error: .* on communicator '[a-z]+(\[[0-9,.]+\])?' rank [0-9]/[0-9]: timed out after 1000 ms" 4
fi
echo "faults: $pass passed, $failures failed"
[ $failures -eq 0 ]
