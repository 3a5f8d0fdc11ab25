#!/usr/bin/env bash
# Usage: cli_test.sh path/to/tessera. Exercises train/eval/sample/schedule/plot and their errors.
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
# Loaded weights trained at the from-scratch default rate: a note says so; not with --lr given.
check init-from-rate-note 0 "note: --init-from without --lr trains the loaded weights at the default 0.003" \
  -- "$bin" train "${tiny[@]}" --steps 1 --init-from "$dir/run"
out=$("$bin" train "${tiny[@]}" --steps 1 --init-from "$dir/run" --lr 1e-4 2>&1)
check init-from-lr-no-note 0 "done: 1 steps" -- echo "$out"
check init-from-lr-no-note-text 1 "" -- grep -q "note: --init-from" <<<"$out"
# A model-shaping flag that differs from the resumed model's would be ignored: refused, naming it;
# the same value (as a restart passes the original flags) is accepted.
check resume-other-dim 1 "^tessera: error: --dim 64 is not the resumed model's 32: a resumed run trains the checkpoint's model" \
  -- "$bin" train "${tiny[@]}" --resume "$dir/run" --dim 64 --steps 14
echo '{"layers": 3}' >"$dir/layers.json"
check resume-other-layers-config 1 "--layers 3 is not the resumed model's 1" -- "$bin" train \
  --resume "$dir/run" --config "$dir/layers.json" --cache-dir "$dir/cache"
check resume-same-shape 0 "resumed from .* at step 14" -- "$bin" train "${tiny[@]}" \
  --resume "$dir/run" --steps 15
check eval 0 "loss [0-9.]+ nats/token" -- "$bin" eval --weights "$dir/run" --data "$dir/corpus.txt" \
  --seq 16 --batch 4
check sample 0 "The" -- "$bin" sample --weights "$dir/run/model.safetensors" --prompt "The" \
  --tokens 10
# The speed on stderr (stdout keeps the text), and the same text with and without the key/value
# cache, through the window sliding past --seq 16.
check sample-speed 0 "decode: 9 tokens in [0-9.]+ s \([0-9.]+ tokens/s\) \| key/value cache" -- \
  "$bin" sample --weights "$dir/run" --prompt "The" --tokens 10
check sample-full-forward 0 "full forward per token" -- "$bin" sample --weights "$dir/run" \
  --prompt "The" --tokens 10 --kv-cache false
"$bin" sample --weights "$dir/run" --prompt "The" --tokens 40 --seed 5 >"$dir/cached.txt" 2>/dev/null
"$bin" sample --weights "$dir/run" --prompt "The" --tokens 40 --seed 5 --kv-cache false \
  >"$dir/full.txt" 2>/dev/null
check sample-same-text 0 "" -- cmp "$dir/cached.txt" "$dir/full.txt"
check sample-stdout-text-only 1 "" -- grep -q "tokens/s" "$dir/cached.txt"
check eval-missing 1 "does not exist" -- "$bin" eval --weights "$dir/none.safetensors" --data x
head -c 100 "$dir/run/model.safetensors" >"$dir/trunc.safetensors"
cp "$dir/run/config.json" "$dir/config.json"
check eval-truncated 1 "trunc.safetensors" -- "$bin" eval --weights "$dir/trunc.safetensors" \
  --data "$dir/corpus.txt"
check bad-recompute 1 "recompute" -- "$bin" train "${tiny[@]}" --recompute partial
check recompute-full 0 "recompute full" -- "$bin" train "${tiny[@]}" --steps 2 --recompute full
check memory-limit 1 "out of memory" -- "$bin" train "${tiny[@]}" --memory-limit 100KiB

# Pipeline schedules: simulated bubble, in-flight peaks, deadlock verdict, SVG; and their errors.
sched=("$bin" schedule --pp 4 --micro-batches 8)
check schedule-help 0 "--virtual-stages" -- "$bin" schedule --help
check schedule-1f1b 0 "bubble: 27.27% of the step idle overall; per rank: 27.27% 27.27% 27.27%" \
  -- "${sched[@]}" --schedule 1f1b --svg "$dir/1f1b.svg"
check schedule-1f1b-peaks 0 "in flight per stage: 4 3 2 1$" -- "${sched[@]}" --schedule 1f1b
check schedule-1f1b-ranks 0 "rank 3: \[recv F0\] F0 B0 \[send B0\] \[recv F1\]" -- \
  "${sched[@]}" --schedule 1f1b
check schedule-deadlock 0 "deadlock check: no deadlock" -- "${sched[@]}" --schedule 1f1b
check schedule-svg 0 "^64$" -- grep -c 'class="box"' "$dir/1f1b.svg"
check schedule-gpipe 0 "in flight per stage: 8 8 8 8" -- "${sched[@]}" --schedule gpipe
check schedule-interleaved 0 "bubble: 15.79% of the step" -- "${sched[@]}" --schedule interleaved \
  --virtual-stages 2
check schedule-zb 0 "bubble: 11.11% of the step" -- "${sched[@]}" --schedule zb-h1 \
  --svg "$dir/zb.svg"
check schedule-zb-svg 0 "^96$" -- grep -c 'class="box"' "$dir/zb.svg"
check schedule-costs 0 "bubble formula: " -- "${sched[@]}" --schedule 1f1b --costs 1,3,1
check schedule-unknown 1 "gpipe" -- "${sched[@]}" --schedule pipedream
check schedule-not-multiple 1 "multiple of the pipeline size pp=4: 6 is not" -- \
  "$bin" schedule --pp 4 --micro-batches 6 --schedule interleaved --virtual-stages 2
check schedule-v-needs-interleaved 1 "need the interleaved schedule" -- "${sched[@]}" \
  --schedule 1f1b --virtual-stages 2
check schedule-bad-costs 1 "F,B,W" -- "${sched[@]}" --schedule 1f1b --costs 1,2
check schedule-missing-pp 1 "pp" -- "$bin" schedule --micro-batches 8 --schedule 1f1b

# Pictures of a run: its timeline and its loss curves.
check train-trace 0 "timeline written" -- "$bin" train "${tiny[@]}" --steps 2 \
  --trace "$dir/trace.json"
check plot-trace 0 "wrote .*trace.svg: 1 ranks, [0-9]+ spans, bubble" -- "$bin" plot \
  --schedule-trace "$dir/trace.json" --out "$dir/trace.svg"
check plot-trace-svg 0 "bubble .*idle share" -- cat "$dir/trace.svg"
check plot-metrics 0 "wrote .*curves.svg: 2 curves" -- "$bin" plot --metrics "$dir/m.jsonl" \
  --key loss --key val_loss --label tiny --out "$dir/curves.svg"
check plot-metrics-svg 0 "tiny val_loss" -- cat "$dir/curves.svg"
check plot-nothing 1 "needs --schedule-trace FILE or --metrics FILE" -- "$bin" plot \
  --out "$dir/x.svg"
check plot-labels 1 "one --label per --metrics file" -- "$bin" plot --metrics "$dir/m.jsonl" \
  --label a --label b --out "$dir/x.svg"
check plot-missing 1 "nope.jsonl" -- "$bin" plot --metrics "$dir/nope.jsonl" --out "$dir/x.svg"
check plot-bad-key 1 "no lines with a step and a 'perplexity' value" -- "$bin" plot \
  --metrics "$dir/m.jsonl" --key perplexity --out "$dir/x.svg"

# The planner: one layout, a ranking, JSON, a train config, errors.
gpt3=(--layers 96 --dim 12288 --heads 96 --seq 2048 --vocab 50257 --batch 1536 --cluster dgx-a100-80gb)
check plan-layout 0 "total .* of 80.00 GiB: fits" -- "$bin" plan "${gpt3[@]}" --tp 8 --pp 64 \
  --dp 6 --micro-batch 1 --recompute full --json "$dir/plan.json"
check plan-json 0 '"tokens_per_second"' -- cat "$dir/plan.json"
check plan-too-big 0 "DOES NOT FIT.*|model states alone" -- "$bin" plan "${gpt3[@]}" --dp 8 \
  --devices 8 --micro-batch 1
check plan-rank 0 "layouts of 64 devices .* fit" -- "$bin" plan --layers 24 --dim 2048 \
  --heads 16 --seq 1024 --vocab 51200 --batch 64 --cluster dgx-a100-80gb --devices 64 --top 3
check plan-train-config 0 "layout: dp=2 tp=1 pp=2" -- "$bin" plan --cluster dgx-a100-80gb \
  --config <(echo '{"layers": 4, "dim": 128, "dp": 2, "pp": 2, "batch": 8, "micro_batch": 1}')
check plan-hsdp-host-one-rank 0 "note: --zero-shard-group host: tp=8 fills a node of 8 devices, so each ZeRO shard group is one rank" -- \
  "$bin" plan "${gpt3[@]}" --tp 8 --pp 8 --dp 48 --zero 3 --zero-shard-group host --micro-batch 1 --recompute full
check plan-bad-layout 1 "must divide the 96 attention heads" -- "$bin" plan "${gpt3[@]}" --tp 7
check plan-bad-cluster 1 "neither a file nor a shipped cluster" -- "$bin" plan --cluster nope --dp 1
check plan-too-many-ranks 1 "oversubscribe" -- "$bin" plan --cluster dev-vm --dp 64
check plan-cp 0 "context parallelism: cp=4 ring" -- "$bin" plan --layers 12 --dim 768 \
  --heads 12 --seq 8192 --vocab 50257 --batch 8 --cluster dgx-h100 --devices 8 --dp 1 --cp 4 \
  --cp-comm ring --micro-batch 1
check plan-cp-config 0 "layout: dp=2 tp=1 pp=1 cp=2 ulysses" -- "$bin" plan --cluster dgx-h100 \
  --config <(echo '{"layers": 4, "dim": 128, "seq": 256, "dp": 2, "cp": 2, "cp_comm": "ulysses",
  "batch": 8}')
check plan-cp-rank 0 "cp=2 (allgather|ring|ulysses)" -- "$bin" plan --layers 4 --dim 256 \
  --heads 8 --seq 4096 --vocab 512 --batch 8 --cluster dgx-h100 --devices 4 --max-cp 2 --top 40
check plan-bad-cp 1 "cuts each sequence into 2 x cp = 8 chunks" -- "$bin" plan --seq 1020 \
  --dp 1 --cp 4
check plan-calibrate-quick 0 '"engine": "tessera"' -- "$bin" plan --calibrate --quick --out -

echo "cli: $pass passed, $failures failed"
[ $failures -eq 0 ]
