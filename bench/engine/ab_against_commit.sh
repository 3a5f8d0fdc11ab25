#!/usr/bin/env bash
# Interleaved A/B of the engine benchmark: an older build of bench_engine (e.g. built in a git
# worktree at an earlier commit) against this one, runs alternating so that machine drift hits
# both alike. Usage: ab_against_commit.sh OLD_BENCH_ENGINE NEW_BENCH_ENGINE [ROUNDS]
set -u
old=${1:?usage: ab_against_commit.sh OLD_BENCH_ENGINE NEW_BENCH_ENGINE [ROUNDS]}
new=${2:?usage: ab_against_commit.sh OLD_BENCH_ENGINE NEW_BENCH_ENGINE [ROUNDS]}
for i in $(seq 1 "${3:-3}"); do
  for side in old new; do
    bin=$old
    [ "$side" = new ] && bin=$new
    echo "== run $i $side"
    "$bin" --only large --steps 6 --warmup 1 | grep -E "^L6|sgemm 2048"
  done
done
