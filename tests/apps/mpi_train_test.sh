#!/usr/bin/env bash
# Usage: mpi_train_test.sh path/to/tessera path/to/mpiexec. Data parallelism under mpirun (one
# rank per process, MPI backend) trains the same model as one rank: dp=2 with ZeRO 0 and 3.
set -u
bin=$1
mpiexec=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 300); do printf 'Line %d of a small corpus for the MPI test.\n%%\n' "$i"; done >"$dir/c.txt"
args=(--data "$dir/c.txt" --cache-dir "$dir/cache" --vocab 300 --layers 2 --dim 32 --heads 2
      --seq 16 --batch 12 --micro-batch 3 --steps 8 --lr 0.01 --warmup 2 --dropout 0.1
      --eval-every 0 --val-fraction 0 --sample-tokens 0 --threads 1)
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1"; }
"$bin" train "${args[@]}" --metrics "$dir/one.jsonl" --save "$dir/one" >"$dir/one.log" 2>&1 || { cat "$dir/one.log"; exit 1; }
failures=0
for zero in 0 3; do
  if ! timeout 120 "$mpiexec" --oversubscribe -n 2 "$bin" train "${args[@]}" --dp 2 --zero $zero \
      --metrics "$dir/mpi$zero.jsonl" --save "$dir/mpi$zero" >"$dir/mpi$zero.log" 2>&1; then
    echo "FAIL mpirun dp=2 zero=$zero"; cat "$dir/mpi$zero.log"; failures=$((failures + 1)); continue
  fi
  grep -q "mpi backend" "$dir/mpi$zero.log" || { echo "FAIL zero=$zero did not use the MPI backend"; failures=$((failures + 1)); }
  if python3 - "$(losses "$dir/one.jsonl")" "$(losses "$dir/mpi$zero.jsonl")" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
assert len(a) == len(b) == 8, (a, b)
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {i + 1}: one rank {x}, mpi {y}"
PY
  then echo "ok   mpirun dp=2 zero=$zero: losses match one rank"; else failures=$((failures + 1)); fi
  if python3 - "$dir/one/model.safetensors" "$dir/mpi$zero/model.safetensors" <<'PY'
import json, math, struct, sys
def load(path):  # safetensors: u64 header length, JSON header, little-endian F32 data
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__": continue
        b, e = t["data_offsets"]
        out[name] = struct.unpack(f"<{(e - b) // 4}f", data[b:e])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys()
for name in a:
    x, y = a[name], b[name]
    if name.endswith("attn.c_attn.bias"):  # the key bias only sees rounding noise (see tests)
        c = len(x) // 3
        x, y = x[:c] + x[2 * c:], y[:c] + y[2 * c:]
    diff = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)))
    norm = math.sqrt(sum(p * p for p in x))
    assert diff <= 1e-4 * norm, f"{name}: |diff| {diff} > 1e-4 x {norm}"
PY
  then echo "ok   mpirun dp=2 zero=$zero: final parameters match one rank"; else failures=$((failures + 1)); fi
done
echo "mpi training: $((4 - failures)) passed, $failures failed"
[ $failures -eq 0 ]
