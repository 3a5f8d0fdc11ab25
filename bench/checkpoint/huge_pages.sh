#!/usr/bin/env bash
# Transparent huge pages for large allocations (core/allocator.cc) on and off: GPT-2 124M (L=12,
# C=768, V=50257, T=1024, B=1, AdamW) on one rank with 2 threads, 10 steps, a background
# checkpoint every 5 (the first one allocates and touches the 1.49 GB host copy), run with
# TESSERA_HUGE_PAGES=0 and =1 interleaved, ROUNDS rounds. Printed per run: the process's wall,
# user and system seconds, the median step, and the step that took the first save's hand-off
# (step 5 to step 6).
#
# Usage: bench/checkpoint/huge_pages.sh [tessera]   env: ROUNDS (2), OUT (default: a temporary
# directory, removed unless given)
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
rounds=${ROUNDS:-2}
keep=${OUT:+1}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -n "$keep" ] || trap 'rm -rf "$out"' EXIT
python3 "$(dirname "$0")/../fortunes_bytes.py" "$out/data.bin"
args=(--data "$out/data.bin" --vocab 50257 --layers 12 --dim 768 --heads 12 --seq 1024 --batch 1
      --steps 10 --warmup 2 --val-fraction 0 --eval-every 0 --sample-tokens 0 --threads 2
      --log-every 1 --cache-dir "$out/cache" --save-every 5)
echo "$(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
for r in $(seq 1 "$rounds"); do
  for hp in 0 1; do
    rm -rf "$out/ck"
    TESSERA_HUGE_PAGES=$hp /usr/bin/time -f "%e %U %S" -o "$out/time" "$bin" train "${args[@]}" \
      --save "$out/ck" 2>&1 | python3 -u -c 'import sys, time
for l in sys.stdin: print(f"{time.time():.3f} {l}", end="", flush=True)' >"$out/log"
    python3 - "$out/log" "$out/time" "$r" "$hp" <<'PY'
import re, statistics, sys
lines = open(sys.argv[1]).read().splitlines()
wall, user, sys_s = open(sys.argv[2]).read().split()[-3:]
ends = {int(p[2].split("/")[0]): float(p[0]) for p in (l.split() for l in lines)
        if len(p) > 3 and p[1] == "step" and "/" in p[2]}
ms = [float(m.group(1)) for m in (re.search(r"(\d+) ms/step", l) for l in lines) if m]
print(f"round {sys.argv[3]} TESSERA_HUGE_PAGES={sys.argv[4]}: {float(wall):.1f} s wall, "
      f"{float(user):.1f} s user, {float(sys_s):.1f} s system; median step "
      f"{statistics.median(ms) / 1e3:.2f} s; step 5 -> 6 (the first save's hand-off) "
      f"{ends[6] - ends[5]:.2f} s")
PY
  done
done
