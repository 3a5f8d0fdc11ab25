#!/usr/bin/env bash
# Usage: mpi_mixed_test.sh path/to/tessera path/to/mpiexec. Several ranks per process
# (--ranks-per-process, the hierarchical backend): each layout trains, bit for bit, the same model
# as its ranks run as threads of one process, as 2 processes of 2 ranks and as 4 processes of 1
# rank: the same loss at every step and the same model.safetensors. Layouts: dp=4 with ZeRO 1
# (a gradient group across both processes), dp=2 x tp=2 with sequence parallelism, pp=2 x dp=2
# with ZeRO 3, a mixture of experts at dp=4 with ep=2, cp=2 (ring) x dp=2, and the Llama family
# at dp=2 x tp=2 with sequence parallelism; dropout 0.1 throughout. Then the errors: a process
# count that does not match the layout, --ranks-per-process without mpirun, and one that does not
# divide the layout.
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
mpiexec=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 300); do printf 'Line %d of a small corpus for the mixed-mapping test.\n%%\n' "$i"; done >"$dir/c.txt"
args=(--data "$dir/c.txt" --cache-dir "$dir/cache" --vocab 300 --layers 2 --dim 32 --heads 2
      --seq 16 --batch 12 --micro-batch 3 --steps 6 --lr 0.01 --warmup 2 --dropout 0.1
      --eval-every 0 --val-fraction 0 --sample-tokens 0 --threads 1)
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1"; }
failures=0
n=0
for layout in "--dp 4 --zero 1" "--dp 2 --tp 2 --sp --zero 1" "--pp 2 --dp 2 --zero 3" \
              "--dp 4 --ep 2 --moe-experts 4 --moe-top-k 2" "--cp 2 --cp-comm ring --dp 2 --zero 1" \
              "--arch llama --kv-heads 2 --dp 2 --tp 2 --sp --zero 1"; do
  n=$((n + 1))
  read -ra flags <<<"$layout"
  # Threads of one process, then 2 x 2 and 4 x 1 processes x ranks.
  "$bin" train "${args[@]}" "${flags[@]}" --metrics "$dir/t$n.jsonl" --save "$dir/t$n" \
    >"$dir/t$n.log" 2>&1 || { echo "FAIL $layout as threads"; cat "$dir/t$n.log"; failures=$((failures + 1)); continue; }
  for shape in "2 2" "4 1"; do
    read -r np rpp <<<"$shape"
    run="m$n-$np-$rpp"
    if ! timeout 180 "$mpiexec" --oversubscribe -n "$np" "$bin" train "${args[@]}" "${flags[@]}" \
        --ranks-per-process "$rpp" --metrics "$dir/$run.jsonl" --save "$dir/$run" >"$dir/$run.log" 2>&1; then
      echo "FAIL $layout on $np processes x $rpp"; cat "$dir/$run.log"; failures=$((failures + 1)); continue
    fi
    a=$(losses "$dir/t$n.jsonl")
    b=$(losses "$dir/$run.jsonl")
    if [ -n "$a" ] && [ "$a" = "$b" ] &&
       cmp -s "$dir/t$n/step-00000006/model.safetensors" "$dir/$run/step-00000006/model.safetensors"; then
      echo "ok   $layout on $np processes x $rpp ranks: the threads' losses and weights, bit for bit"
    else
      echo "FAIL $layout on $np processes x $rpp ranks: losses $b, threads $a (weights: $(cmp "$dir/t$n/step-00000006/model.safetensors" "$dir/$run/step-00000006/model.safetensors" 2>&1))"
      failures=$((failures + 1))
    fi
  done
done
# 3 processes x 2 ranks for a layout of 4.
out=$(timeout 60 "$mpiexec" --oversubscribe -n 3 "$bin" train "${args[@]}" --dp 4 --ranks-per-process 2 2>&1)
if echo "$out" | grep -q "mpirun started 3 processes of --ranks-per-process 2 = 6 ranks, but the layout has 4"; then
  echo "ok   3 processes x 2 ranks for a layout of 4: a clear error"
else
  echo "FAIL 3 processes x 2 ranks for a layout of 4: $out"; failures=$((failures + 1))
fi
out=$("$bin" train "${args[@]}" --dp 2 --ranks-per-process 2 2>&1)
if echo "$out" | grep -q "applies under mpirun"; then
  echo "ok   --ranks-per-process without mpirun: a clear error"
else
  echo "FAIL --ranks-per-process without mpirun: $out"; failures=$((failures + 1))
fi
out=$("$bin" train "${args[@]}" --dp 3 --ranks-per-process 2 2>&1)
if echo "$out" | grep -q "ranks-per-process 2 does not divide the 3 ranks of the layout"; then
  echo "ok   --ranks-per-process that does not divide the layout: a clear error"
else
  echo "FAIL --ranks-per-process that does not divide the layout: $out"; failures=$((failures + 1))
fi
[ "$failures" = 0 ] && echo "all mixed-mapping checks passed" && exit 0
echo "$failures failure(s)"
exit 1
