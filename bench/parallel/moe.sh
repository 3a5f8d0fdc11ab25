#!/usr/bin/env bash
# Mixture of experts, measured (docs/PERFORMANCE.md, "Mixture of experts"):
#   speed    E = 8, top-2, ep = 2 (dp = 2, one thread per rank) against one rank holding all 8
#            experts (one thread), at the same per-rank work: each rank runs BATCH sequences (the
#            ep run's global batch is twice the single rank's) and, on average, the same number of
#            expert assignments. GPT L=4 C=256 heads 4 T=128, every block MoE, dropless
#            (CAPACITY=f for a capacity factor). The two sides alternate, ROUNDS times each;
#            medians of the runs' median tokens/s. From freshly initialised weights, whose router
#            sends most tokens to a few experts (the worst case for expert parallelism).
#   steady   the same after WARM_STEPS (default 300) steps of training at ep = 2 with the default
#            load-balancing loss: both sides start from those weights (--init-from), where the
#            router's load is spread as in the rest of a training run.
#   COMPARE=path/to/older/tessera adds, in each round of speed or steady, that build's ep = 2 run
#            (after the two above), and its speed-up, for an A/B of two versions of the code.
#   balance  the default corpus and model (`tessera train` defaults) with E = 8, top-2, 500
#            steps, with the default load-balancing loss (0.01) and without it (0), both runs at
#            once with one BLAS thread each: the busiest expert's share over the mean share (1/E),
#            per MoE layer, averaged over the last 50 steps, from the metrics.
# Usage: bench/parallel/moe.sh [tessera] [speed|steady|balance|all]. Timings want a quiet machine.
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
what=${2:-all}
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"
echo "moe.sh: logs in $out"

if [[ $what == speed || $what == steady || $what == all ]]; then
  batch=${BATCH:-8}
  args=(--cache-dir "$out/cache" --vocab 4096 --val-fraction 0 --eval-every 0 --sample-tokens 0
        --layers 4 --dim 256 --heads 4 --seq 128 --steps ${STEPS:-12} --warmup 1 --threads 1
        --moe-experts 8 --moe-top-k 2 --moe-every 1 --moe-capacity-factor ${CAPACITY:-0})
  "$bin" train "${args[@]}" --batch "$batch" --steps 0 >/dev/null  # tokenizer and token cache
  if [[ $what == steady ]]; then
    warm=${WARM_STEPS:-300}
    echo "training $warm steps at ep = 2 for the starting weights"
    "$bin" train "${args[@]}" --batch $((2 * batch)) --dp 2 --ep 2 --steps "$warm" \
      --save "$out/warm" --log-every "$warm" | grep -E "^step|^done"
    args+=(--init-from "$out/warm/model.safetensors")
  fi
  TIMEFORMAT='%U %S'  # user and system CPU seconds of each run, into *.cpu
  for round in $(seq 1 "${ROUNDS:-3}"); do
    { time "$bin" train "${args[@]}" --batch "$batch" >"$out/one_$round.log"; } 2>"$out/one_$round.cpu"
    { time "$bin" train "${args[@]}" --batch $((2 * batch)) --dp 2 --ep 2 \
        >"$out/ep2_$round.log"; } 2>"$out/ep2_$round.cpu"
    grep "^done" "$out/one_$round.log" | sed "s/^/round $round, one rank: /"
    grep "^done" "$out/ep2_$round.log" | sed "s/^/round $round, ep=2:     /"
    if [[ -n ${COMPARE:-} ]]; then
      "$COMPARE" train "${args[@]}" --batch $((2 * batch)) --dp 2 --ep 2 >"$out/cmp_$round.log"
      grep "^done" "$out/cmp_$round.log" | sed "s/^/round $round, ep=2 (COMPARE): /"
    fi
  done
  python3 - "$out" "${ROUNDS:-3}" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def tok(path):
    m = re.search(r"([0-9.]+) tokens/s", open(path).read())
    return float(m.group(1)) if m else float("nan")
one = [tok(f"{out}/one_{r}.log") for r in range(1, rounds + 1)]
ep2 = [tok(f"{out}/ep2_{r}.log") for r in range(1, rounds + 1)]
ratios = [b / a for a, b in zip(one, ep2)]
print(f"tokens/s one rank {[round(x) for x in one]} median {statistics.median(one):.0f}")
print(f"tokens/s ep=2     {[round(x) for x in ep2]} median {statistics.median(ep2):.0f}")
print(f"speed-up per round {[round(r, 2) for r in ratios]}, median {statistics.median(ratios):.2f}x")
import os
if os.path.exists(f"{out}/cmp_1.log"):
    cmp = [tok(f"{out}/cmp_{r}.log") for r in range(1, rounds + 1)]
    print(f"COMPARE's ep=2 {[round(x) for x in cmp]}: speed-up per round "
          f"{[round(b / a, 2) for a, b in zip(one, cmp)]}, median "
          f"{statistics.median(b / a for a, b in zip(one, cmp)):.2f}x; this build / COMPARE per "
          f"round {[round(b / a, 3) for a, b in zip(cmp, ep2)]}")
# Tokens per CPU-second (the whole run's user + system time): what the speed-up would be if each
# rank had a core to itself. On a loaded machine the scheduler may give the two ranks no more CPU
# than the one (then the wall-clock speed-up is about 1x even though no work is lost).
def per_cpu(side, r, steps_tokens):
    u, s = (float(x) for x in open(f"{out}/{side}_{r}.cpu").read().split()[-2:])
    return steps_tokens / (u + s)
import os
steps = int(os.environ.get("STEPS", "12"))
batch = int(os.environ.get("BATCH", "8"))
one_c = [per_cpu("one", r, steps * batch * 128) for r in range(1, rounds + 1)]
ep2_c = [per_cpu("ep2", r, steps * 2 * batch * 128) for r in range(1, rounds + 1)]
cpu_ratio = [b / a for a, b in zip(one_c, ep2_c)]
print(f"tokens per CPU-second: one rank median {statistics.median(one_c):.0f}, ep=2 median "
      f"{statistics.median(ep2_c):.0f}; ep=2 / one per round {[round(r, 2) for r in cpu_ratio]} "
      f"(a speed-up of 2 x this with a core per rank)")
PY
fi

if [[ $what == balance || $what == all ]]; then
  steps=${BALANCE_STEPS:-500}
  # The two runs side by side, one BLAS thread each (the loads do not depend on the timing).
  for aux in 0.01 0; do
    "$bin" train --moe-experts 8 --moe-top-k 2 --steps "$steps" --eval-every 0 --sample-tokens 0 \
      --threads 1 --moe-aux-loss $aux --metrics "$out/balance_aux$aux.jsonl" \
      >"$out/balance_aux$aux.log" &
  done
  wait
  for aux in 0.01 0; do tail -n 3 "$out/balance_aux$aux.log"; done
  python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for aux in ("0.01", "0"):
    rows = [json.loads(l) for l in open(f"{out}/balance_aux{aux}.jsonl") if '"moe_load"' in l]
    last = rows[-50:]
    layers = sorted(last[0]["moe_load"])
    ratios = {}
    for name in layers:
        E = len(last[0]["moe_load"][name])
        share = [sum(r["moe_load"][name][e] for r in last) / len(last) for e in range(E)]
        ratios[name] = max(share) * E
    worst = max(ratios.values())
    per = ", ".join(f"{n} {v:.2f}" for n, v in ratios.items())
    print(f"aux loss {aux}: busiest expert / mean share over steps {last[0]['step']}-"
          f"{last[-1]['step']}: {per}; worst {worst:.2f}x "
          f"({'within' if worst <= 1.25 else 'above'} 1.25x); final loss {rows[-1]['loss']:.4f}")
PY
fi
