#!/usr/bin/env bash
# Data parallelism and ZeRO, measured (issue 4). Usage: bench/parallel/run.sh [path/to/tessera]
#  1. model-state memory per rank at dp=4 for ZeRO 0..3 against 16, 8+8/N, 4+12/N, 16/N bytes/param
#  2. --memory-limit: a model that does not fit one rank under plain DP trains under ZeRO-3 on 4
#  3. throughput: dp=2 (one thread per rank) against one rank (one thread), L=6 C=512 T=256
#  4. communication bytes per rank per step for each stage, and overlap seen on the timeline
# Timings want a quiet machine: run nothing else meanwhile.
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
corpus=(--cache-dir "$out/cache" --vocab 4096 --val-fraction 0 --eval-every 0 --sample-tokens 0)
big=(--layers 6 --dim 512 --heads 8)

echo "== 1. model-state memory per rank, dp=4, GPT L=6 C=512 V=4096"
for z in 0 1 2 3; do
  "$bin" train "${corpus[@]}" "${big[@]}" --seq 64 --batch 4 --steps 1 --dp 4 --zero $z \
    --bucket-mb 4 --threads 1 >"$out/mem$z.log"
done
python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def size(s):
    v, u = s.split()
    return float(v) * units[u]
rows = []
for z in range(4):
    log = open(f"{out}/mem{z}.log").read()
    params = float(re.search(r"([0-9.]+)M parameters", log).group(1)) * 1e6
    line = [l for l in log.splitlines() if l.startswith("memory: rank 0")][0]
    cats = dict((k.strip(), size(v)) for k, v in re.findall(r";\s*([a-z ]+?) ([0-9.]+ [KMG]?i?B)", line))
    state = cats.get("parameters", 0) + cats.get("gradients", 0) + cats.get("optimizer state", 0)
    n = 4
    formula = [16, 8 + 8 / n, 4 + 12 / n, 16 / n][z] * params
    rows.append((z, params, state, formula, cats.get("buffers", 0)))
print(f"{'zero':>4} {'Psi':>10} {'measured MiB':>13} {'formula MiB':>12} {'ratio':>6} {'in flight MiB':>14}")
for z, p, s, f, b in rows:
    print(f"{z:>4} {p:>10.0f} {s/2**20:>13.1f} {f/2**20:>12.1f} {s/f:>6.3f} {b/2**20:>14.1f}")
PY

echo
echo "== 2. --memory-limit 200MiB per rank: plain DP on one rank, then ZeRO-3 on 4 ranks"
if "$bin" train "${corpus[@]}" "${big[@]}" --seq 64 --batch 4 --steps 1 --memory-limit 200MiB \
    --threads 1 >"$out/oom.log" 2>&1; then
  echo "unexpected: fits one rank"
else
  grep -o "out of memory.*" "$out/oom.log" | head -c 300; echo
fi
"$bin" train "${corpus[@]}" "${big[@]}" --seq 64 --batch 4 --steps 3 --dp 4 --zero 3 \
  --bucket-mb 4 --memory-limit 200MiB --threads 1 | grep -E "^done|memory: rank 0"

echo
echo "== 3. throughput, L=6 C=512 T=256, 4 sequences per rank, one thread per rank"
"$bin" train "${corpus[@]}" "${big[@]}" --seq 256 --batch 4 --steps 8 --warmup 1 --threads 1 \
  --dp 1 | grep "^done" | tee "$out/t1"
"$bin" train "${corpus[@]}" "${big[@]}" --seq 256 --batch 8 --steps 8 --warmup 1 --threads 1 \
  --dp 2 --trace "$out/trace.json" | grep "^done" | tee "$out/t2"
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
t1 = float(re.search(r"([0-9.]+) tokens/s", open(f"{out}/t1").read()).group(1))
t2 = float(re.search(r"([0-9.]+) tokens/s", open(f"{out}/t2").read()).group(1))
print(f"dp=2 / dp=1 tokens/s (median step): {t2 / t1:.2f}x")
ev = [e for e in json.load(open(f"{out}/trace.json"))["traceEvents"] if e["ph"] == "X" and e["pid"] == 0]
bwd = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["cat"] == "backward" and e["tid"] == 0 and "unit 0" not in e["name"] and "embeddings" not in e["name"]]
comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == 1 and "all_reduce" in e["name"]]
overlap = sum(max(0, min(c1, b1) - max(c0, b0)) for c0, c1 in comm for b0, b1 in bwd)
total = sum(c1 - c0 for c0, c1 in comm)
print(f"rank 0: {len(comm)} all-reduce spans, {100 * overlap / max(total, 1):.0f}% of their time overlaps a block's backward")
PY

echo
echo "== 4. communication per rank per step (dp=4, one micro-batch), L=6 C=512"
for z in 0 1 2 3; do
  "$bin" train "${corpus[@]}" "${big[@]}" --seq 64 --batch 4 --steps 2 --dp 4 --zero $z \
    --bucket-mb 4 --threads 1 --metrics "$out/comm$z.jsonl" >/dev/null
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
b = [json.loads(open(f"{out}/comm{z}.jsonl").readlines()[-1])["comm_bytes_per_rank"] for z in range(4)]
for z in range(4):
    print(f"zero {z}: {b[z] / 2**20:8.1f} MiB per rank per step ({b[z] / b[0]:.2f}x plain DP)")
PY
