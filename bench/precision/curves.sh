#!/usr/bin/env bash
# The 1% check of mixed precision: the default main job (`tessera train` with its defaults: the
# fortunes corpus, GPT L=4 C=192, 1000 steps) once in fp32 and once in bf16 (everything else
# equal: same seed, data, batches), then the final training and validation losses of both and
# their relative differences. The training loss of one step depends on its batch, so the last
# STEPS_MEAN steps' mean is compared too. The check passes when the final validation loss and the
# mean training loss of bf16 are within LIMIT (default 1%) of fp32's.
#
# Usage: bench/precision/curves.sh [tessera] [extra train flags...]
#   env: OUT (a directory to keep the logs and metrics; default a temporary one), PARALLEL=1 (run
#   both at once, one BLAS thread each: the machine's 2 cores; default one after the other),
#   STEPS_MEAN (50), LIMIT (0.01)
# Numerically the emulated bf16 path (no avx512_bf16) is a bf16 GEMM, so any machine gives the
# check; its speed is not a bf16 speed.
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
shift || true
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
steps_mean=${STEPS_MEAN:-50}
limit=${LIMIT:-0.01}
run() {  # precision [flags...]
  local p=$1
  shift
  "$bin" train --precision "$p" --metrics "$out/$p.jsonl" --sample-tokens 0 "$@" \
    "${extra[@]}" >"$out/$p.log" 2>&1 || { tail -20 "$out/$p.log"; exit 1; }
}
extra=("$@")
# Prepare the data (tokenizer and token files, cached under runs/cache) once, before the runs.
"$bin" train --steps 0 --sample-tokens 0 "${extra[@]}" >/dev/null
echo "$(date -u +%FT%TZ) start; load average $(cut -d' ' -f1-3 /proc/loadavg); logs in $out"
if [[ ${PARALLEL:-0} == 1 ]]; then
  run fp32 --threads 1 &
  a=$!
  run bf16 --threads 1 &
  b=$!
  wait "$a"
  wait "$b"
else
  run fp32
  run bf16
fi
echo "$(date -u +%FT%TZ) done; load average $(cut -d' ' -f1-3 /proc/loadavg)"
grep -h "^precision:" "$out/fp32.log" "$out/bf16.log" || true
python3 - "$out" "$steps_mean" "$limit" <<'PY'
import json, sys
out, k, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def curve(p):
    rows = [json.loads(l) for l in open(f"{out}/{p}.jsonl")]
    train = [r for r in rows if "loss" in r and "step_ms" in r]
    val = [r for r in rows if "val_loss" in r]
    return train, val

res = {}
for p in ("fp32", "bf16"):
    train, val = curve(p)
    res[p] = {"steps": train[-1]["step"], "train_last": train[-1]["loss"],
              "train_mean": sum(r["loss"] for r in train[-k:]) / len(train[-k:]),
              "val": val[-1]["val_loss"] if val else float("nan")}
rel = lambda key: (res["bf16"][key] - res["fp32"][key]) / res["fp32"][key]
print(f"{'':24}{'fp32':>10}{'bf16':>10}{'bf16/fp32 - 1':>16}")
for key, name in (("train_last", "train loss, last step"),
                  ("train_mean", f"train loss, last {k} mean"), ("val", "validation loss, final")):
    print(f"{name:24}{res['fp32'][key]:10.4f}{res['bf16'][key]:10.4f}{100 * rel(key):+15.3f}%")
ok = abs(rel("val")) <= limit and abs(rel("train_mean")) <= limit
print(f"steps: {res['fp32']['steps']} and {res['bf16']['steps']}; "
      f"within {100 * limit:g}%: {'yes' if ok else 'NO'}")
sys.exit(0 if ok else 1)
PY
