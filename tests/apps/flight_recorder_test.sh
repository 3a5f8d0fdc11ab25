#!/usr/bin/env bash
# Usage: flight_recorder_test.sh path/to/tessera. The flight recorder and `tessera doctor`
# (docs/RELIABILITY.md, "Flight recorder"), end to end on thread ranks: for each injected fault
# kind (a rank that skips a call, a mismatched call, a rank delayed past the deadline, a rank that
# exits) a short run with --flight-recorder DIR fails, every rank leaves a dump, and the doctor
# names the faulty rank and the call (op and communicator). SIGUSR2 dumps without stopping the
# run. The metrics carry every rank's compute and wait time, and a rank delayed below the
# deadline is named as the slowest.
set -u
bin=$1
# shellcheck source=tests/apps/run_lib.sh
source "$(dirname "$0")/run_lib.sh"

for i in $(seq 1 200); do printf 'Line %d of a corpus for the flight recorder tests.\n%%\n' "$i"; done >"$dir/c.txt"
common=(--data "$dir/c.txt" --cache-dir "$dir/cache" --vocab 300 --layers 2 --dim 32 --heads 2
        --seq 16 --batch 8 --micro-batch 2 --steps 6 --lr 0.01 --warmup 2 --eval-every 0
        --val-fraction 0 --sample-tokens 0 --threads 1 --comm-timeout 1 --backend inproc)
comm_re="'[a-z]+(\[[0-9,.]+\])?'"
steps_logged() { local n; n=$(grep -c '"loss":' "$1" 2>/dev/null); echo "${n:-0}"; }

# faulty NAME FAULT EXPECTED_SENTENCE_ERE LAYOUT...: the run fails within 20 s; rank-<R>.json for
# every rank; the doctor's first line matches the pattern; --json names the same rank and call.
faulty() {
  local name=$1 fault=$2 want=$3
  shift 3
  local fr=$dir/$name t0=$SECONDS out
  TESSERA_FAULT="$fault" timeout 60 "$bin" train "${common[@]}" "$@" --flight-recorder "$fr" \
    >"$fr.log" 2>&1
  local rc=$?
  [ "$rc" = 1 ] && ok "$name: the run fails (status 1)" || fail "$name: status $rc" "$fr.log"
  [ $((SECONDS - t0)) -le 20 ] && ok "$name: within 20 s" || fail "$name: took $((SECONDS - t0)) s"
  local ranks
  ranks=$(find "$fr" -name 'rank-*.json' 2>/dev/null | wc -l)
  [ "$ranks" = "$WORLD" ] && ok "$name: $ranks dumps" || fail "$name: $ranks dumps, wanted $WORLD" "$fr.log"
  out=$("$bin" doctor "$fr" 2>&1)
  if head -1 <<<"$out" | grep -qE -- "$want"; then
    ok "$name: doctor: $(head -1 <<<"$out")"
  else
    echo "$out" >"$fr.doctor"
    fail "$name: doctor says something else (wanted /$want/)" "$fr.doctor"
  fi
  "$bin" doctor --json "$fr" >"$fr.json" 2>&1 || fail "$name: doctor --json failed" "$fr.json"
}

WORLD=2
# A rank that does not issue one of the data-parallel all-reduces (the middle one of a step's
# three buckets): its peer waits and times out, while it goes on to the next bucket.
faulty skip "rank=1,op=8,comm=dp,call=all_reduce,kind=skip" \
  "^world rank 1 never issued all_reduce \(F32 x [0-9]+, sum\) #[0-9]+ on communicator $comm_re, which rank 0 issued and waited in .*its next was all_reduce #[0-9]+" \
  --dp 2 --bucket-mb 0.02
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(not (d["diagnosis"] == "never_issued" and d["rank"] == 1 and d["call"]["op"] == "all_reduce"
              and d["call"]["comm"].startswith("dp")))' "$dir/skip.json" &&
  ok "skip: doctor --json names rank 1's all_reduce on dp" || fail "skip: doctor --json" "$dir/skip.json"

# A rank delayed past the deadline: it issued the call, late.
faulty delay "rank=1,op=2,comm=dp,call=all_reduce,kind=delay:30s" \
  "^world rank 1 was late: it issued all_reduce \(F32 x [0-9]+, sum\) #[0-9]+ on communicator $comm_re [0-9.]+ s after rank 0" \
  --dp 2

# A rank that exits (an inproc rank's thread leaves, as a crashed process would).
faulty exit "rank=1,op=3,comm=dp,call=all_reduce,kind=exit" \
  "^world rank 1 is dead: it exited .* while rank 0 waited for it in all_reduce \(F32 x [0-9]+, sum\) #[0-9]+ on communicator $comm_re" \
  --dp 2

# A rank that issues another call: a minority of one among four.
WORLD=4
faulty mismatch "rank=2,op=2,comm=dp,call=all_reduce,kind=mismatch" \
  "^world rank 2 issued barrier as call #[0-9]+ on communicator $comm_re where ranks 0, 1 and 3 issued all_reduce \(F32 x [0-9]+, sum\)" \
  --dp 4

# SIGUSR2 dumps every rank and the run goes on to its last step.
run=$dir/usr2
"$bin" train "${common[@]}" --dp 2 --steps 400 --log-every 1000 --metrics "$run.jsonl" \
  --flight-recorder "$run" >"$run.log" 2>&1 &
pid=$!
pids+=("$pid")
t=0
while [ "$(steps_logged "$run.jsonl")" -lt 3 ] && kill -0 "$pid" 2>/dev/null && [ $t -lt 3000 ]; do
  sleep 0.01
  t=$((t + 1))
done
kill -USR2 "$pid"
t=0
while [ "$(find "$run" -name 'rank-*.json' 2>/dev/null | wc -l)" -lt 2 ] && [ $t -lt 2000 ]; do
  sleep 0.01
  t=$((t + 1))
done
t=0
while kill -0 "$pid" 2>/dev/null && [ $t -lt 6000 ]; do sleep 0.01; t=$((t + 1)); done
kill -KILL "$pid" 2>/dev/null
wait "$pid"
rc=$?
[ "$rc" = 0 ] && ok "SIGUSR2: the run finishes (status 0)" || fail "SIGUSR2: status $rc" "$run.log"
grep -q '"step":400,' "$run.jsonl" && ok "SIGUSR2: the run reached its last step" ||
  fail "SIGUSR2: no step 400 in the metrics" "$run.log"
for r in 0 1; do
  grep -q '"reason": "signal"' "$run/rank-$r.json" 2>/dev/null && ok "SIGUSR2: rank $r dumped" ||
    fail "SIGUSR2: no dump of rank $r" "$run.log"
done
grep -q "SIGUSR2: flight recorder dumped to $run/rank-0.json" "$run.log" &&
  ok "SIGUSR2: the log says where" || fail "SIGUSR2: the log does not say where" "$run.log"
"$bin" doctor "$run" >"$run.doctor" 2>&1
grep -q "^every recorded call completed on every rank (2 of 2 ranks dumped)" "$run.doctor" &&
  ok "SIGUSR2: doctor: every call completed" || fail "SIGUSR2: doctor" "$run.doctor"

# Stragglers: every rank's compute and wait time per step; a rank delayed 300 ms (below the
# deadline) at a call of step 3 or so is named as the slowest, in the metrics and the progress
# line.
run=$dir/slow
TESSERA_FAULT="rank=1,op=6,comm=dp,call=all_reduce,kind=delay:300ms" timeout 60 "$bin" train \
  "${common[@]}" --dp 2 --steps 8 --log-every 1 --metrics "$run.jsonl" >"$run.log" 2>&1
rc=$?
[ "$rc" = 0 ] && ok "straggler: the run finishes" || fail "straggler: status $rc" "$run.log"
python3 -c 'import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if "\"loss\"" in l]
assert len(recs) == 8, len(recs)
for r in recs:
    assert len(r["compute_ms"]) == 2 and len(r["wait_ms"]) == 2, r
    assert all(c >= 0 for c in r["compute_ms"]) and all(w >= 0 for w in r["wait_ms"]), r
    assert abs(r["compute_ms"][0] + r["wait_ms"][0] - r["step_ms"]) < 0.01, r  # rank 0 logs
# The step of the delay: rank 1 computed 300 ms more, rank 0 waited for it, and rank 1 is named
# (timer noise on these 1 ms steps may name a rank elsewhere, so only that step is checked).
hit = max(recs, key=lambda r: r["compute_ms"][1])
assert hit["compute_ms"][1] >= 250 and hit["wait_ms"][0] >= 250, hit
assert hit.get("slowest_rank") == 1 and hit["slowest_ratio"] > 1.25, hit
' "$run.jsonl" 2>"$run.check" && ok "straggler: compute and wait per rank; rank 1 named slowest" ||
  fail "straggler: metrics" "$run.check"
grep -qE "compute ms [0-9]+ [0-9]+ \| wait ms [0-9]+ [0-9]+ \| slowest rank 1 \([0-9.]+x\)" "$run.log" &&
  ok "straggler: the progress line names rank 1" || fail "straggler: progress line" "$run.log"

# A directory that cannot be made is refused before any work, not at the first dump.
timeout 30 "$bin" train "${common[@]}" --flight-recorder /proc/no-such-dir >"$dir/badfr.log" 2>&1
grep -q "^tessera: error: cannot create the directory /proc/no-such-dir" "$dir/badfr.log" &&
  ! grep -q "^data:" "$dir/badfr.log" && ok "an unwritable --flight-recorder: refused before any work" ||
  fail "an unwritable --flight-recorder" "$dir/badfr.log"

echo "$pass passed, $failures failed"
[ "$failures" = 0 ]
