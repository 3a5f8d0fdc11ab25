#!/usr/bin/env bash
# Usage: mpi_train_test.sh path/to/tessera path/to/mpiexec. Training under mpirun (one rank per
# process, MPI backend) trains the same model as one rank: dp=2 with ZeRO 0 and 3; tensor
# parallelism tp=2 (2 processes) and dp=2 x tp=2 with ZeRO-1 (4 processes); the 3D layout
# pp=2 x dp=2 x tp=2 with ZeRO 1 and 3 (8 processes); each model-parallel run's final loss also
# equals the same layout run as threads; recomputation (full at dp=2 ZeRO-3 and in 3D, selective
# at dp=2 x tp=2); sequence parallelism (tp=2 --sp, and dp=2 x tp=2 --sp with ZeRO-1); a mixture
# of experts with expert parallelism (ep=2, also with tp=2); the Llama family in 3D with --sp;
# context parallelism (cp=2, each --cp-comm, with dp=2 ZeRO-1 and tp=2 --sp);
# bf16 at dp=2 x tp=2 (rank 0's GEMM path in every process); and the error for too few
# processes.
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
checks=0
# Each layout: "pp dp zero tp recompute sp"; mpirun starts pp x dp x tp processes. The 3D ones
# are the seed's layout in miniature (pipelines across, ZeRO over dp, tp fastest), 8 processes.
for layout in "1 2 0 1 none 0" "1 2 3 1 full 0" "1 1 0 2 none 0" "1 2 1 2 selective 0" \
              "1 1 0 2 none 1" "1 2 1 2 none 1" "2 2 1 2 none 0" "2 2 3 2 full 0"; do
  read -r pp dp zero tp rc sp <<<"$layout"
  np=$((pp * dp * tp))
  run="$pp-$dp-$zero-$tp-$rc-$sp"
  spflag=()
  [ "$sp" = 1 ] && spflag=(--sp)
  name="pp=$pp dp=$dp zero=$zero tp=$tp recompute=$rc${spflag[*]:+ sp}"
  checks=$((checks + 2))
  if ! timeout 180 "$mpiexec" --oversubscribe -n $np "$bin" train "${args[@]}" --pp $pp --dp $dp \
      --zero $zero --tp $tp --recompute $rc "${spflag[@]}" \
      --metrics "$dir/mpi$run.jsonl" --save "$dir/mpi$run" >"$dir/mpi$run.log" 2>&1; then
    echo "FAIL mpirun -n $np $name"; cat "$dir/mpi$run.log"; failures=$((failures + 2)); continue
  fi
  grep -q "mpi backend" "$dir/mpi$run.log" || { echo "FAIL $name did not use the MPI backend"; failures=$((failures + 1)); }
  if [ "$tp" -gt 1 ] || [ "$pp" -gt 1 ]; then  # the same layout as threads: the same final loss
    checks=$((checks + 1))
    "$bin" train "${args[@]}" --pp $pp --dp $dp --zero $zero --tp $tp --recompute $rc "${spflag[@]}" --backend inproc \
      --metrics "$dir/thr$run.jsonl" >"$dir/thr$run.log" 2>&1 || { cat "$dir/thr$run.log"; exit 1; }
    if python3 -c "import sys; a = float(sys.argv[1].split()[-1]); b = float(sys.argv[2].split()[-1]); sys.exit(0 if abs(a - b) <= 1e-6 * abs(a) else 1)" \
        "$(losses "$dir/thr$run.jsonl")" "$(losses "$dir/mpi$run.jsonl")"; then
      echo "ok   mpirun $name: final loss equals the thread run's"
    else
      echo "FAIL mpirun $name: final loss $(losses "$dir/mpi$run.jsonl" | awk '{print $NF}') vs threads $(losses "$dir/thr$run.jsonl" | awk '{print $NF}')"
      failures=$((failures + 1))
    fi
  fi
  if python3 - "$(losses "$dir/one.jsonl")" "$(losses "$dir/mpi$run.jsonl")" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
assert len(a) == len(b) == 8, (a, b)
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {i + 1}: one rank {x}, mpi {y}"
PY
  then echo "ok   mpirun $name: losses match one rank"; else failures=$((failures + 1)); fi
  if python3 - "$dir/one/model.safetensors" "$dir/mpi$run/model.safetensors" <<'PY'
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
  then echo "ok   mpirun $name: final parameters match one rank"; else failures=$((failures + 1)); fi
done
# The Llama family (rotary, 2 query over 2 key/value heads, SwiGLU, an
# untied head, q/k/v biases, attention dropout) in the 3D layout pp=2 x dp=2 (ZeRO-1) x tp=2 with
# sequence parallelism: 8 processes train what the same layout trains as threads (the final loss)
# and what one rank trains (every step's loss within 1e-5).
llama=(--arch llama --kv-heads 2 --ffn-dim 48 --tie-embeddings false --qkv-bias true)
checks=$((checks + 2))
"$bin" train "${args[@]}" "${llama[@]}" --metrics "$dir/llama1.jsonl" >"$dir/llama1.log" 2>&1 || { cat "$dir/llama1.log"; exit 1; }
"$bin" train "${args[@]}" "${llama[@]}" --pp 2 --dp 2 --tp 2 --sp --zero 1 --backend inproc \
  --metrics "$dir/llamathr.jsonl" >"$dir/llamathr.log" 2>&1 || { cat "$dir/llamathr.log"; exit 1; }
if timeout 180 "$mpiexec" --oversubscribe -n 8 "$bin" train "${args[@]}" "${llama[@]}" --pp 2 --dp 2 \
    --tp 2 --sp --zero 1 --metrics "$dir/llamampi.jsonl" >"$dir/llamampi.log" 2>&1 &&
  python3 - "$(losses "$dir/llama1.jsonl")" "$(losses "$dir/llamathr.jsonl")" "$(losses "$dir/llamampi.jsonl")" <<'PY'
import sys
one, thr, mpi = ([float(x) for x in a.split()] for a in sys.argv[1:])
assert len(one) == len(thr) == len(mpi) == 8, (one, thr, mpi)
assert abs(mpi[-1] - thr[-1]) <= 1e-6 * abs(thr[-1]), f"final loss: threads {thr[-1]}, mpi {mpi[-1]}"
for i, (x, y) in enumerate(zip(one, mpi)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {i + 1}: one rank {x}, mpi {y}"
PY
then
  echo "ok   mpirun llama pp=2 dp=2 zero=1 tp=2 sp: the thread run's final loss, one rank's losses"
else
  echo "FAIL mpirun llama pp=2 dp=2 zero=1 tp=2 sp"; tail -20 "$dir/llamampi.log"; failures=$((failures + 2))
fi

# Mixture of experts with expert parallelism under mpirun: E = 4, top-2, capacity 0.75, against
# one rank holding every expert (losses within 1e-5, parameters within 1e-4), and the same layout
# as threads (the same final loss): ep=2 x dp=2 ZeRO-1 (2 processes), ep=2 x dp=2 x tp=2 ZeRO-3
# (4 processes).
moe=(--moe-experts 4 --moe-top-k 2 --moe-capacity-factor 0.75)
"$bin" train "${args[@]}" "${moe[@]}" --metrics "$dir/moe1.jsonl" --save "$dir/moe1" >"$dir/moe1.log" 2>&1 || { cat "$dir/moe1.log"; exit 1; }
for layout in "2 2 1 1" "2 2 3 2"; do
  read -r dp ep zero tp <<<"$layout"
  np=$((dp * tp))
  run="moe-$dp-$ep-$zero-$tp"
  name="MoE dp=$dp ep=$ep zero=$zero tp=$tp"
  checks=$((checks + 3))
  if ! timeout 180 "$mpiexec" --oversubscribe -n $np "$bin" train "${args[@]}" "${moe[@]}" --dp $dp \
      --ep $ep --zero $zero --tp $tp --metrics "$dir/mpi$run.jsonl" --save "$dir/mpi$run" \
      >"$dir/mpi$run.log" 2>&1; then
    echo "FAIL mpirun -n $np $name"; cat "$dir/mpi$run.log"; failures=$((failures + 3)); continue
  fi
  "$bin" train "${args[@]}" "${moe[@]}" --dp $dp --ep $ep --zero $zero --tp $tp --backend inproc \
    --metrics "$dir/thr$run.jsonl" >"$dir/thr$run.log" 2>&1 || { cat "$dir/thr$run.log"; exit 1; }
  if python3 - "$(losses "$dir/moe1.jsonl")" "$(losses "$dir/mpi$run.jsonl")" "$(losses "$dir/thr$run.jsonl")" <<'PY'
import sys
a, b, t = ([float(x) for x in s.split()] for s in sys.argv[1:4])
assert len(a) == len(b) == len(t) == 8, (a, b, t)
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {i + 1}: one rank {x}, mpi {y}"
assert abs(t[-1] - b[-1]) <= 1e-6 * abs(t[-1]), f"final loss: threads {t[-1]}, mpi {b[-1]}"
PY
  then echo "ok   mpirun $name: losses match one rank and the thread run"; else failures=$((failures + 2)); fi
  if python3 - "$dir/moe1/model.safetensors" "$dir/mpi$run/model.safetensors" <<'PY'
import json, math, struct, sys
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: struct.unpack(f"<{(t['data_offsets'][1] - t['data_offsets'][0]) // 4}f",
                             data[t["data_offsets"][0]:t["data_offsets"][1]])
            for k, t in header.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys() and "h.1.mlp.experts.3.c_fc.weight" in a
for name in a:
    x, y = a[name], b[name]
    if name.endswith("attn.c_attn.bias"):
        c = len(x) // 3
        x, y = x[:c] + x[2 * c:], y[:c] + y[2 * c:]
    diff = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)))
    assert diff <= 1e-4 * math.sqrt(sum(p * p for p in x)), name
PY
  then echo "ok   mpirun $name: final parameters (every expert) match one rank"; else failures=$((failures + 1)); fi
done
# Context parallelism under mpirun: each sequence split over cp=2 processes, every --cp-comm, with
# dp=2 (ZeRO-1) and tp=2 --sp: every step's loss within 1e-5 of one rank, the final loss the
# thread run's.
for layout in "allgather 1 0 2" "ring 2 1 1" "ulysses 1 0 1"; do
  read -r comm dp zero tp <<<"$layout"
  np=$((2 * dp * tp))
  run="cp-$comm-$dp-$tp"
  spflag=()
  [ "$tp" -gt 1 ] && spflag=(--sp)
  name="cp=2 $comm dp=$dp zero=$zero tp=$tp${spflag[*]:+ sp}"
  cp=(--cp 2 --cp-comm "$comm" --dp "$dp" --zero "$zero" --tp "$tp" "${spflag[@]}")
  checks=$((checks + 2))
  if ! timeout 180 "$mpiexec" --oversubscribe -n $np "$bin" train "${args[@]}" "${cp[@]}" \
      --metrics "$dir/mpi$run.jsonl" >"$dir/mpi$run.log" 2>&1; then
    echo "FAIL mpirun -n $np $name"; tail -20 "$dir/mpi$run.log"; failures=$((failures + 2)); continue
  fi
  "$bin" train "${args[@]}" "${cp[@]}" --backend inproc --metrics "$dir/thr$run.jsonl" \
    >"$dir/thr$run.log" 2>&1 || { cat "$dir/thr$run.log"; exit 1; }
  if python3 - "$(losses "$dir/one.jsonl")" "$(losses "$dir/mpi$run.jsonl")" "$(losses "$dir/thr$run.jsonl")" <<'PY'
import sys
a, b, t = ([float(x) for x in s.split()] for s in sys.argv[1:4])
assert len(a) == len(b) == len(t) == 8, (a, b, t)
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {i + 1}: one rank {x}, mpi {y}"
assert abs(t[-1] - b[-1]) <= 1e-6 * abs(t[-1]), f"final loss: threads {t[-1]}, mpi {b[-1]}"
PY
  then echo "ok   mpirun $name: losses match one rank and the thread run"; else failures=$((failures + 2)); fi
done
# --precision bf16 under mpirun: rank 0 resolves --bf16-gemm auto and every process takes its
# path; dp=2 x tp=2 ZeRO-1 (4 processes) records the path its start-up line names and ends at the
# final loss of the same layout as threads on that path (given explicitly: auto measures, and a
# second measurement may choose the other path where the two are close).
checks=$((checks + 1))
bf=(--precision bf16 --dp 2 --tp 2 --zero 1)
if timeout 180 "$mpiexec" --oversubscribe -n 4 "$bin" train "${args[@]}" "${bf[@]}" \
    --metrics "$dir/mpibf.jsonl" --save "$dir/mpibf" >"$dir/mpibf.log" 2>&1; then
  path=$(grep -ho '"bf16_gemm_path": "[a-z]*"' "$dir"/mpibf/step-*/state.json | head -1 | cut -d'"' -f4)
  said="emulated"
  [ "$path" = onednn ] && said="through oneDNN"
  if [ -n "$path" ] && grep -q "^precision: bf16, bf16 GEMMs $said" "$dir/mpibf.log" &&
      "$bin" train "${args[@]}" "${bf[@]}" --bf16-gemm "$path" --backend inproc \
        --metrics "$dir/thrbf.jsonl" >"$dir/thrbf.log" 2>&1 &&
      python3 -c "import sys; a = float(sys.argv[1].split()[-1]); b = float(sys.argv[2].split()[-1]); sys.exit(0 if abs(a - b) <= 1e-6 * abs(a) else 1)" \
        "$(losses "$dir/thrbf.jsonl")" "$(losses "$dir/mpibf.jsonl")"; then
    echo "ok   mpirun bf16 dp=2 tp=2: path $path recorded and named; final loss equals the thread run's"
  else
    echo "FAIL mpirun bf16: path '$path'; final losses $(losses "$dir/mpibf.jsonl" | awk '{print $NF}') (mpi) vs $(losses "$dir/thrbf.jsonl" 2>/dev/null | awk '{print $NF}') (threads)"
    grep "^precision" "$dir/mpibf.log"; failures=$((failures + 1))
  fi
else
  echo "FAIL mpirun bf16 dp=2 tp=2"; tail -20 "$dir/mpibf.log"; failures=$((failures + 1))
fi
# Too few processes for --dp x --tp: a ConfigError that says what is wrong, before any work.
checks=$((checks + 1))
if timeout 60 "$mpiexec" --oversubscribe -n 2 "$bin" train "${args[@]}" --tp 2 --dp 2 >"$dir/bad.log" 2>&1; then
  echo "FAIL mpirun -n 2 --dp 2 --tp 2 succeeded"; failures=$((failures + 1))
elif grep -q "mpirun started 2 processes but --pp 1 x --dp 2 x --tp 2 = 4" "$dir/bad.log"; then
  echo "ok   mpirun -n 2 --dp 2 --tp 2: says the job needs 4 processes"
else
  echo "FAIL unexpected error for too few processes:"; cat "$dir/bad.log"; failures=$((failures + 1))
fi
echo "mpi training: $((checks - failures)) passed, $failures failed"
[ $failures -eq 0 ]
