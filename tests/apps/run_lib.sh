# Sourced by the tests that start training runs in the background (stop_test.sh,
# async_save_test.sh): a scratch directory $dir removed at exit, background runs recorded in
# pids=() killed at exit, and the counters and reporters ok, fail NAME [LOG] and check NAME CMD...
# shellcheck shell=bash
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
failures=0
pass=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
fail() { echo "FAIL $1"; [ -n "${2:-}" ] && tail -25 "$2"; failures=$((failures + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else fail "$name"; fi; }
