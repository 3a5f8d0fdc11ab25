#!/usr/bin/env bash
# Usage: cli_test.sh path/to/tessera. Exercises train/eval/sample and their errors.
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
pass=0
check() {  # check NAME EXPECTED_STATUS PATTERN -- command...
  local name=$1 want=$2 pattern=$3
  shift 4
  local out status
  out=$("$@" 2>&1)
  status=$?
  if { [ "$want" = 0 ] && [ $status -ne 0 ]; } || { [ "$want" != 0 ] && [ $status -eq 0 ]; } ||
     ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name (status $status, wanted $want, pattern '$pattern')"
    echo "$out" | tail -20
    failures=$((failures + 1))
  else
    echo "ok   $name"
    pass=$((pass + 1))
  fi
}

for i in $(seq 1 200); do
  printf 'The cat sat on the mat number %d.\n%%\nA stitch in time saves nine.\n%%\n' "$i"
done >"$dir/corpus.txt"
tiny=(--data "$dir/corpus.txt" --cache-dir "$dir/cache" --vocab 300 --layers 1 --dim 32 --heads 2
      --seq 16 --batch 4 --threads 1 --sample-tokens 8 --eval-every 0)

check help 0 "train" -- "$bin" --help
check train-help 0 "--grad-clip" -- "$bin" train --help
check unknown-flag 1 "bogus" -- "$bin" train --bogus
check bad-value 1 "steps" -- "$bin" train --steps lots
check bad-optimizer 1 "adamw" -- "$bin" train --optimizer adam
check heads-divide 1 "does not divide" -- "$bin" train "${tiny[@]}" --heads 3
check missing-data 1 "does not exist" -- "$bin" train "${tiny[@]}" --data "$dir/nope.txt"
echo '{"layerz": 2}' >"$dir/bad.json"
check bad-config-key 1 "unknown config key 'layerz'" -- "$bin" train --config "$dir/bad.json"
check train 0 "done: 12 steps" -- "$bin" train "${tiny[@]}" --steps 12 --save "$dir/run" \
  --metrics "$dir/m.jsonl"
check metrics-lines 0 '"tokens_per_s"' -- cat "$dir/m.jsonl"
check metrics-val 0 '"val_loss"' -- cat "$dir/m.jsonl"
echo '{"steps": 14, "lr": 0.001}' >"$dir/more.json"
check resume-config 0 "resumed from .* at step 12" -- "$bin" train --resume "$dir/run" \
  --config "$dir/more.json" --cache-dir "$dir/cache"
check eval 0 "loss [0-9.]+ nats/token" -- "$bin" eval --weights "$dir/run" --data "$dir/corpus.txt" \
  --seq 16 --batch 4
check sample 0 "The" -- "$bin" sample --weights "$dir/run/model.safetensors" --prompt "The" \
  --tokens 10
check eval-missing 1 "does not exist" -- "$bin" eval --weights "$dir/none.safetensors" --data x
head -c 100 "$dir/run/model.safetensors" >"$dir/trunc.safetensors"
cp "$dir/run/config.json" "$dir/config.json"
check eval-truncated 1 "trunc.safetensors" -- "$bin" eval --weights "$dir/trunc.safetensors" \
  --data "$dir/corpus.txt"
check bad-recompute 1 "recompute" -- "$bin" train "${tiny[@]}" --recompute partial
check recompute-full 0 "recompute full" -- "$bin" train "${tiny[@]}" --steps 2 --recompute full
check memory-limit 1 "out of memory" -- "$bin" train "${tiny[@]}" --memory-limit 100KiB

echo "cli: $pass passed, $failures failed"
[ $failures -eq 0 ]
