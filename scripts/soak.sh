#!/usr/bin/env bash
# Soak test (docs/RELIABILITY.md): a long training run under AddressSanitizer + LeakSanitizer
# with data parallelism and ZeRO-3, frequent checkpoints and validation, reporting whether memory
# stays flat and nothing leaks:
#   * the allocator's in-use bytes and per-category peaks, logged by rank 0 at every validation
#     (the metrics' mem_* fields), must not change after the first checkpoint cycle;
#   * the process's resident set size, sampled every SOAK_SAMPLE seconds, must not grow past
#     SOAK_RSS_GROWTH (default 5%) from its median in the second quarter of the run to its
#     maximum in the last;
#   * LeakSanitizer must report nothing at exit.
# Usage: scripts/soak.sh [STEPS]   (default 3000; ~15 minutes on 2 loaded cores)
# Environment: SOAK_BUILD (default build-asan, configured as scripts/test.sh does), SOAK_DP (2),
# SOAK_ZERO (3), SOAK_SAVE_EVERY (100), SOAK_EVAL_EVERY (50), SOAK_SAMPLE (2), SOAK_OUT (a
# temporary directory, kept when set), SOAK_RSS_GROWTH (0.05).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-3000}
build=${SOAK_BUILD:-build-asan}
dp=${SOAK_DP:-2}
zero=${SOAK_ZERO:-3}
save_every=${SOAK_SAVE_EVERY:-100}
eval_every=${SOAK_EVAL_EVERY:-50}
sample=${SOAK_SAMPLE:-2}
growth=${SOAK_RSS_GROWTH:-0.05}
out=${SOAK_OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -n "${SOAK_OUT:-}" ] || trap 'rm -rf "$out"' EXIT

if [ ! -x "$build/apps/tessera/tessera" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_WERROR=ON \
    -DTESSERA_SANITIZE=address,undefined -DTESSERA_BENCH=OFF "${launcher[@]}" >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target tessera >/dev/null
bin=$build/apps/tessera/tessera

for i in $(seq 1 3000); do
  printf 'Soak line %d: the quick brown fox jumps over the lazy dog %d times.\n%%\n' "$i" $((i % 97))
done >"$out/corpus.txt"
# A small model, so that thousands of steps fit in minutes under ASan.
args=(--data "$out/corpus.txt" --cache-dir "$out/cache" --vocab 320 --layers 2 --dim 48
      --heads 2 --seq 32 --batch 8 --micro-batch 2 --steps "$steps" --warmup 50 --lr 3e-3
      --dropout 0.1 --dp "$dp" --zero "$zero" --threads 1 --eval-every "$eval_every"
      --eval-batches 4 --save-every "$save_every" --save "$out/run" --metrics "$out/metrics.jsonl"
      --sample-tokens 0 --log-every 500)
echo "soak: $bin train ${args[*]}"
export ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=64:malloc_context_size=10
start=$(date +%s)
"$bin" train "${args[@]}" >"$out/train.log" 2>&1 &
pid=$!
: >"$out/rss.tsv"
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  [ -n "$rss" ] && printf '%s\t%s\n' $(($(date +%s) - start)) "$rss" >>"$out/rss.tsv"
  sleep "$sample"
done
status=0
wait "$pid" || status=$?
elapsed=$(($(date +%s) - start))
echo "soak: exit status $status after ${elapsed} s"
tail -12 "$out/train.log"
python3 - "$out" "$status" "$growth" "$save_every" "$steps" "$elapsed" <<'PY'
import json, statistics, sys
out, status, growth, save_every, steps, elapsed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
log = open(f"{out}/train.log").read()
mem = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if '"mem_in_use"' in l]
rss = [tuple(map(int, l.split())) for l in open(f"{out}/rss.tsv") if l.strip()]
ok = True
def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok = ok and cond
check(status == 0, f"the run ended with status {status}")
check("LeakSanitizer" not in log and "AddressSanitizer" not in log and "runtime error" not in log,
      "no AddressSanitizer, LeakSanitizer or UndefinedBehaviorSanitizer report")
check(f"done: {steps} steps" in log, f"trained {steps} steps")
keys = sorted(k for k in mem[0] if k.startswith("mem_")) if mem else []
after = [m for m in mem if m["step"] >= 2 * save_every]
print(f"allocator (rank 0), {len(mem)} validations; from step {after[0]['step'] if after else '?'} on:")
for k in keys:
    vals = [m[k] for m in after]
    print(f"  {k:28s} first {vals[0] if vals else '-':>10} last {vals[-1] if vals else '-':>10} "
          f"min {min(vals) if vals else '-':>10} max {max(vals) if vals else '-':>10}")
    check(len(set(vals)) == 1, f"{k} is the same at every validation after step {2 * save_every}")
if len(rss) >= 8:
    n = len(rss)
    q2 = statistics.median(r for _, r in rss[n // 4: n // 2])
    last = max(r for _, r in rss[3 * n // 4:])
    print(f"RSS: {n} samples; first {rss[0][1] / 1024:.0f} MiB, median of the 2nd quarter "
          f"{q2 / 1024:.0f} MiB, max of the last quarter {last / 1024:.0f} MiB, peak "
          f"{max(r for _, r in rss) / 1024:.0f} MiB")
    check(last <= q2 * (1 + growth), f"RSS grows at most {growth:.0%} after the first quarter "
          f"({(last / q2 - 1) * 100:+.1f}%)")
else:
    check(False, "too few RSS samples")
print(f"soak: {'PASS' if ok else 'FAIL'}, {steps} steps in {elapsed} s")
sys.exit(0 if ok else 1)
PY
