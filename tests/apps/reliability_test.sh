#!/usr/bin/env bash
# Usage: reliability_test.sh path/to/tessera. Full disks and unwritable paths, end to end
# (docs/RELIABILITY.md):
#   * an unwritable --save or --metrics path stops the run before any work, naming the path;
#   * a checkpoint that does not fit (a tiny tmpfs, or RLIMIT_FSIZE) fails with an error naming
#     the path and the system's reason, leaves the previous checkpoint as `latest` with no
#     partial files, and the run resumes from it to the same losses as a run that never failed;
#   * killed mid-save (SIGXFSZ's default action), the previous checkpoint still loads.
# The tmpfs cases need mount (root with CAP_SYS_ADMIN); without it they print SKIPPED and the
# RLIMIT_FSIZE cases, which need no privileges, still run. The script re-executes itself in a
# private mount namespace when it can, so its mounts vanish with it however it ends.
set -u
bin=$1
if [ "${TESSERA_RELIABILITY_NS:-0}" != 1 ] && [ "$(id -u)" = 0 ] &&
   unshare -m --propagation private true 2>/dev/null; then
  TESSERA_RELIABILITY_NS=1 exec unshare -m --propagation private bash "$0" "$@"
fi
dir=$(mktemp -d)
cleanup() {
  for m in "$dir/disk" "$dir/ro"; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
  rm -rf "$dir"
}
trap cleanup EXIT
failures=0
pass=0
out=""
check() {  # check NAME EXPECTED_STATUS PATTERN -- command...  (the output is left in $out)
  local name=$1 want=$2 pattern=$3
  shift 4
  local status
  out=$("$@" 2>&1)
  status=$?
  if [ "$status" != "$want" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name (status $status, wanted $want, pattern '$pattern')"
    echo "$out" | tail -20
    failures=$((failures + 1))
  else
    echo "ok   $name"
    pass=$((pass + 1))
  fi
}
expect() {  # expect NAME CONDITION-COMMAND...: a check of state rather than of a run
  local name=$1
  shift
  if "$@"; then
    echo "ok   $name"
    pass=$((pass + 1))
  else
    echo "FAIL $name"
    failures=$((failures + 1))
  fi
}
no_work_done() { ! grep -qE "^(data|model|step) " <<<"$out"; }
latest_is() { [ "$(cat "$1/latest" 2>/dev/null)" = "$2" ]; }
no_leftovers() {  # nothing but complete checkpoints, the pointer and the exported files
  local extra
  extra=$(ls -A "$1" | grep -vE '^(latest|step-[0-9]{8}|model\.safetensors|config\.json|tokenizer\.json)$')
  [ -z "$extra" ] || { echo "     leftovers in $1: $extra"; return 1; }
}
loss_at() {  # loss_at METRICS STEP: the training loss logged for STEP
  grep '"loss":' "$1" | grep "\"step\":$2," | tail -1 | grep -oE '"loss":[^,]+'
}
same_loss() {
  local a b
  a=$(loss_at "$1" "$3") b=$(loss_at "$2" "$3")
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "     step $3: '$a' vs '$b'"; return 1; }
}

for i in $(seq 1 200); do
  printf 'The cat sat on the mat number %d.\n%%\nA stitch in time saves nine.\n%%\n' "$i"
done >"$dir/corpus.txt"
tiny=(--data "$dir/corpus.txt" --cache-dir "$dir/cache" --vocab 300 --layers 1 --dim 32 --heads 2
      --seq 16 --batch 4 --threads 1 --sample-tokens 0 --eval-every 0)
evaluate=(eval --data "$dir/corpus.txt" --seq 16 --batch 4 --max-windows 8)

echo "== unwritable paths: the run stops before any work"
echo x >"$dir/file"
check metrics-under-a-file 1 "metrics file '$dir/file/m.jsonl'.*Not a directory" -- \
  "$bin" train "${tiny[@]}" --steps 4 --metrics "$dir/file/m.jsonl"
expect metrics-under-a-file-no-work no_work_done
check metrics-is-a-directory 1 "metrics file '$dir'.*Is a directory" -- \
  "$bin" train "${tiny[@]}" --steps 4 --metrics "$dir"
expect metrics-is-a-directory-no-work no_work_done
check save-under-a-file 1 "$dir/file/run.*Not a directory" -- \
  "$bin" train "${tiny[@]}" --steps 4 --save "$dir/file/run"
expect save-under-a-file-no-work no_work_done

# An uninterrupted run: the losses a run that failed to save and resumed must reproduce.
check reference-run 0 "done: 8 steps" -- "$bin" train "${tiny[@]}" --steps 8 --save-every 4 \
  --save "$dir/ref" --metrics "$dir/ref.jsonl"
step_kb=$(du -sk "$dir/ref/step-00000008" | cut -f1)
first_kb=$(du -sk --exclude=step-00000008 "$dir/ref" | cut -f1)

mkdir -p "$dir/disk" "$dir/ro"
if why=$(mount -t tmpfs -o ro,size=1m tmpfs "$dir/ro" 2>&1); then
  echo "== read-only file system"
  check save-read-only 1 "cannot write into the directory $dir/ro.*Read-only file system" -- \
    "$bin" train "${tiny[@]}" --steps 4 --save "$dir/ro"
  expect save-read-only-no-work no_work_done
  check metrics-read-only 1 "metrics file '$dir/ro/m.jsonl'.*Read-only file system" -- \
    "$bin" train "${tiny[@]}" --steps 4 --metrics "$dir/ro/m.jsonl"
  expect metrics-read-only-no-work no_work_done
  umount "$dir/ro"

  # Room for everything the first save writes and half a checkpoint more: the save at step 8
  # runs out of space while writing its step directory.
  size_kb=$((first_kb + step_kb / 2))
  echo "== full disk: a ${size_kb} KiB tmpfs (one save takes ${first_kb} KiB, a step directory ${step_kb} KiB)"
  mount -t tmpfs -o size=${size_kb}k tmpfs "$dir/disk"
  check full-disk 1 "could not save checkpoint step-00000008 in $dir/disk: .*$dir/disk/step-00000008.tmp/.*No space left on device.*still $dir/disk/step-00000004" -- \
    "$bin" train "${tiny[@]}" --steps 8 --save-every 4 --save "$dir/disk" --metrics "$dir/disk.jsonl"
  expect full-disk-first-save-done grep -q "saved checkpoint $dir/disk/step-00000004" <<<"$out"
  expect full-disk-latest-is-step-4 latest_is "$dir/disk" step-00000004
  expect full-disk-no-partial-files no_leftovers "$dir/disk"
  check full-disk-step-4-evaluates 0 "loss [0-9.]+ nats/token" -- "$bin" "${evaluate[@]}" \
    --weights "$dir/disk/step-00000004" --tokenizer "$dir/disk/tokenizer.json"
  mount -o remount,size=64m "$dir/disk"  # space freed
  check full-disk-resume 0 "resumed from $dir/disk/step-00000004 at step 4" -- \
    "$bin" train --resume "$dir/disk" --cache-dir "$dir/cache"
  expect full-disk-resume-done grep -q "done: 8 steps" <<<"$out"
  expect full-disk-resumed-losses-match same_loss "$dir/ref.jsonl" "$dir/disk.jsonl" 8
  expect full-disk-latest-is-step-8 latest_is "$dir/disk" step-00000008
  expect full-disk-no-leftovers-after-resume no_leftovers "$dir/disk"
  umount "$dir/disk"
else
  echo "SKIPPED: full disk and read-only cases on tmpfs: mount is not permitted here (${why//$'\n'/ })"
fi

echo "== file size limit (RLIMIT_FSIZE): the optimizer state does not fit under it"
limit_kb=$(( $(stat -c %s "$dir/ref/step-00000004/model.safetensors") / 1024 + 8 ))
check limit-first-run 0 "done: 4 steps" -- "$bin" train "${tiny[@]}" --steps 4 --save "$dir/lim" \
  --metrics "$dir/lim.jsonl"
# SIGXFSZ ignored (inherited through exec): write() fails with EFBIG and tessera reports it.
check limit-save-fails 1 "could not save checkpoint step-00000008 in $dir/lim: .*File too large.*still $dir/lim/step-00000004" -- \
  bash -c 'trap "" XFSZ; ulimit -f "$1"; shift; exec "$@"' _ "$limit_kb" \
  "$bin" train --resume "$dir/lim" --cache-dir "$dir/cache" --steps 8 --save-every 4
expect limit-latest-is-step-4 latest_is "$dir/lim" step-00000004
expect limit-no-partial-files no_leftovers "$dir/lim"
# With the default action the process is killed mid-write (status 128 + SIGXFSZ = 153): a crash,
# which may leave a staging directory, never a damaged checkpoint.
check limit-killed-by-sigxfsz 153 "" -- \
  bash -c 'trap - XFSZ; ulimit -f "$1"; shift; exec "$@"' _ "$limit_kb" \
  "$bin" train --resume "$dir/lim" --cache-dir "$dir/cache" --steps 8 --save-every 4
expect limit-killed-latest-is-step-4 latest_is "$dir/lim" step-00000004
check limit-killed-step-4-evaluates 0 "loss [0-9.]+ nats/token" -- "$bin" "${evaluate[@]}" \
  --weights "$dir/lim/step-00000004" --tokenizer "$dir/lim/tokenizer.json"
check limit-resume 0 "resumed from $dir/lim/step-00000004 at step 4" -- \
  "$bin" train --resume "$dir/lim" --cache-dir "$dir/cache" --steps 8 --save-every 4
expect limit-resume-done grep -q "done: 8 steps" <<<"$out"
expect limit-resumed-losses-match same_loss "$dir/ref.jsonl" "$dir/lim.jsonl" 8
expect limit-no-leftovers-after-resume no_leftovers "$dir/lim"

echo "reliability: $pass passed, $failures failed"
[ $failures -eq 0 ]
