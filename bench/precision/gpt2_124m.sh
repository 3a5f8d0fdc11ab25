#!/usr/bin/env bash
# GPT-2 124M (L=12, C=768, 12 heads, V=50257; context = T) from scratch with AdamW at
# T=64, B=4 on one rank using the machine's cores: the median step time and the allocator's
# per-rank peaks (total and by category) in fp32 and in bf16.
#
# Data: the fortunes corpus's bytes as token ids in a raw uint16 file (nanoGPT's train.bin
# format) with --vocab 50257, so the model has GPT-2's vocabulary without training a 50257-entry
# BPE on a 2.5 MB corpus (which ids occur does not change a step's cost or memory).
#
# On a CPU without avx512_bf16/amx_bf16 bf16 runs the emulated path (OpenBLAS on bf16-rounded
# copies): its time is NOT a bf16 speed figure, only the memory is meaningful there.
#
# Usage: bench/precision/gpt2_124m.sh [tessera] [extra train flags...]
#   env: STEPS (6; the first is not timed), OUT (keep logs there; default a temporary directory)
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
shift || true
steps=${STEPS:-6}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
python3 "$(dirname "$0")/../fortunes_bytes.py" "$out/fortunes_bytes.bin"
args=(--data "$out/fortunes_bytes.bin" --vocab 50257 --layers 12 --dim 768 --heads 12 --seq 64
      --batch 4 --steps "$steps" --warmup 1 --val-fraction 0 --eval-every 0 --sample-tokens 0
      --cache-dir "$out/cache" "$@")
echo "$(date -u +%FT%TZ) load average $(cut -d' ' -f1-3 /proc/loadavg); logs in $out"
for p in fp32 bf16; do
  "$bin" train "${args[@]}" --precision "$p" --metrics "$out/$p.jsonl" >"$out/$p.log" 2>&1 ||
    { tail -20 "$out/$p.log"; exit 1; }
  grep -h "^model:\|^precision:\|^memory:" "$out/$p.log"
done
echo "$(date -u +%FT%TZ) load average $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def mib(text):
    v, u = text.split()
    return float(v) * units[u] / 2**20
rows = {}
for p in ("fp32", "bf16"):
    steps = [json.loads(l) for l in open(f"{out}/{p}.jsonl") if '"step_ms"' in l]
    log = open(f"{out}/{p}.log").read()
    m = re.search(r"memory: rank 0: peak ([0-9.]+ [KMG]?i?B).*?parameters ([0-9.]+ [KMG]?i?B); "
                  r"gradients ([0-9.]+ [KMG]?i?B); optimizer state ([0-9.]+ [KMG]?i?B); "
                  r"activations ([0-9.]+ [KMG]?i?B)", log)
    rows[p] = {"step_s": statistics.median(s["step_ms"] for s in steps[1:]) / 1e3,
               "loss": steps[-1]["loss"], "peak": mib(m[1]), "params": mib(m[2]),
               "grads": mib(m[3]), "optim": mib(m[4]), "acts": mib(m[5])}
print("| precision | median step (s) | peak MiB | parameters | gradients | optimizer | activations | loss at last step |")
print("|---|---|---|---|---|---|---|---|")
for p, r in rows.items():
    print(f"| {p} | {r['step_s']:.2f} | {r['peak']:.1f} | {r['params']:.1f} | {r['grads']:.1f} | "
          f"{r['optim']:.1f} | {r['acts']:.1f} | {r['loss']:.4f} |")
print(f"bf16/fp32: step time {rows['bf16']['step_s'] / rows['fp32']['step_s']:.2f}x, "
      f"peak memory {rows['bf16']['peak'] / rows['fp32']['peak']:.3f}x")
PY
