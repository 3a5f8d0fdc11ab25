#!/usr/bin/env bash
# Tensor and sequence parallelism, measured: one rank with one thread against tp=2 and
# tp=2 --sp (one thread per rank, both ranks threads of one process), GPT L=6 C=512 heads 8
# T=256 V=4096, batch 4 sequences (the same global batch: tensor parallelism splits each
# sequence's work, not the batch). The three runs are interleaved (1, tp, sp; then sp, 1, tp;
# ...) REPEATS times; each run's figure is its median step (the first step is not timed), and
# the speed-ups are the ratios within one round, reported with their medians and how many
# rounds met the targets (1.8x for tp=2, 1.75x for tp=2 --sp). Because a loaded machine does not
# give the ranks their cores, it also reports the process CPU time per step (every rank's thread):
# t x CPU(one rank) / CPU(t ranks) is the speed-up t dedicated cores would give if no rank ever
# waited (spinning waits count as CPU time, so it errs low). For every layout it also prints
# each rank's activation and model-state peaks and the bytes each rank sent per step, next to
# the formulas of docs/PERFORMANCE.md.
#
# Usage: bench/parallel/tp.sh [tessera]     env: REPEATS (3), STEPS (8), TP (2)
# Timings want a quiet machine: run nothing else meanwhile.
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
repeats=${REPEATS:-3}
steps=${STEPS:-8}
tp=${TP:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--cache-dir "$out/cache" --vocab 4096 --val-fraction 0 --eval-every 0 --sample-tokens 0
      --layers 6 --dim 512 --heads 8 --seq 256 --batch 4 --steps "$steps" --warmup 1 --threads 1)
layouts=(one tp sp)
flags_of() {
  case $1 in
    one) echo "--tp 1" ;;
    tp) echo "--tp $tp" ;;
    sp) echo "--tp $tp --sp" ;;
  esac
}
"$bin" train "${args[@]}" --steps 0 >/dev/null  # prepares the data (tokenizer, token file) once
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$repeats"); do
  for k in 0 1 2; do  # rotate the order every round
    l=${layouts[$(((k + r - 1) % 3))]}
    # shellcheck disable=SC2046
    "$bin" train "${args[@]}" $(flags_of "$l") --metrics "$out/$l.$r.jsonl" >"$out/$l.$r.log" 2>&1 ||
      { cat "$out/$l.$r.log"; exit 1; }
    echo "round $r: $l done ($(grep -o '[0-9]* tokens/s' "$out/$l.$r.log" | tail -1))"
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$repeats" "$tp" <<'PY'
import json, re, statistics, sys
out, repeats, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
L, C, a, T, V, B = 6, 512, 8, 256, 4096, 4
n = B * T  # tokens per micro-batch (one micro-batch per step)

def median_tokens(path):
    rows = [json.loads(x) for x in open(path) if '"tokens_per_s"' in x]
    return statistics.median(r["tokens_per_s"] for r in rows[1:]), rows[-1]

def median_cpu_ms(path):
    rows = [json.loads(x) for x in open(path) if '"process_cpu_ms"' in x]
    return statistics.median(r["process_cpu_ms"] for r in rows[1:])

def peaks(log):  # per rank: activations and model state (parameters + gradients + optimizer)
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    res = []
    for line in open(log):
        if not line.startswith("memory: "): continue
        cat = dict((m.group(1), float(m.group(2)) * unit[m.group(3)]) for m in
                   re.finditer(r"; ([a-z ]+) ([0-9.]+) (B|KiB|MiB|GiB)", line))
        res.append((cat.get("activations", 0),
                    cat.get("parameters", 0) + cat.get("gradients", 0) + cat.get("optimizer state", 0)))
    return res

def formulas(tt, sp):
    """Per rank, fp32, recompute none, no dropout, one micro-batch of n = B*T tokens."""
    per = -(-n // tt) if sp else n      # residual-stream rows of a rank
    full = per * tt if sp else n        # rows of the buffers collectives fill
    f = 4
    block = f * (per * (3 * C + 4) + n * 12 * C // tt + n * (a // tt) * T)  # + probabilities
    record = 4 * n + f * (L + 1) * per * C + L * block  # tokens, hidden states, blocks
    record += f * (full * C + 2 * per + n * (V // tt) + 3 * n)  # head: ln_f, stats, logits, lse, losses, targets
    workspace = f * (2 * full * C + (full * C if sp else 0) + n * 8 * C // tt + T * T)
    acts = record + workspace + f * per * C + f * 2 * n  # + d_residual, the head's row statistics
    # Model state: 16 bytes per local element (value, gradient, two AdamW moments).
    local = (V // tt) * C + T * C + L * (12 * C * C // tt + 7 * C // tt + 6 * C) + 2 * C
    state = 16 * local
    # Bytes sent per step (ring accounting, as parallel::CommVolume).
    ar = lambda elems: 2 * (tt - 1) / tt * f * elems
    gather = lambda rows: (tt - 1) * f * (rows // tt if sp else rows) * C  # all-gather or reduce-scatter of rows
    if tt == 1: sent = 0.0
    elif not sp: sent = ar((4 * L + 2) * n * C + 3 * n)
    else: sent = gather(full) * (10 * L + 4) + ar(3 * n) + ar((4 * L + 2) * C)
    return acts, state, sent

one = {}
tok = {l: [] for l in ("one", "tp", "sp")}
cpu = {l: [] for l in tok}
for r in range(1, repeats + 1):
    for l in tok:
        tok[l].append(median_tokens(f"{out}/{l}.{r}.jsonl")[0])
        cpu[l].append(median_cpu_ms(f"{out}/{l}.{r}.jsonl"))
print(f"\ntokens/s per round (median step), GPT L={L} C={C} heads {a} T={T} V={V} B={B}:")
print(f"{'round':>5} {'tp=1':>8} {'tp='+str(t):>8} {'tp='+str(t)+' sp':>9} {'tp/1':>6} {'sp/1':>6}")
ratios_tp, ratios_sp = [], []
for i in range(repeats):
    rt, rs = tok["tp"][i] / tok["one"][i], tok["sp"][i] / tok["one"][i]
    ratios_tp.append(rt); ratios_sp.append(rs)
    print(f"{i + 1:>5} {tok['one'][i]:>8.0f} {tok['tp'][i]:>8.0f} {tok['sp'][i]:>9.0f} {rt:>6.2f} {rs:>6.2f}")
print(f"median speed-up: tp={t} {statistics.median(ratios_tp):.2f}x "
      f"({sum(x >= 1.8 for x in ratios_tp)} of {repeats} rounds >= 1.8x), tp={t} --sp "
      f"{statistics.median(ratios_sp):.2f}x ({sum(x >= 1.75 for x in ratios_sp)} of {repeats} rounds >= 1.75x)")
print(f"\nprocess CPU ms per step (all ranks), median over steps:")
print(f"{'round':>5} {'tp=1':>8} {'tp='+str(t):>8} {'tp='+str(t)+' sp':>9} {'t x cpu1/cpu_tp':>16} {'t x cpu1/cpu_sp':>16}")
bound_tp, bound_sp = [], []
for i in range(repeats):
    bt, bs = t * cpu["one"][i] / cpu["tp"][i], t * cpu["one"][i] / cpu["sp"][i]
    bound_tp.append(bt); bound_sp.append(bs)
    print(f"{i + 1:>5} {cpu['one'][i]:>8.0f} {cpu['tp'][i]:>8.0f} {cpu['sp'][i]:>9.0f} {bt:>16.2f} {bs:>16.2f}")
print(f"median CPU-time bound: tp={t} {statistics.median(bound_tp):.2f}x, tp={t} --sp {statistics.median(bound_sp):.2f}x")
print("\nper rank (rank 0 of each layout; every rank is printed in the logs):")
print(f"{'layout':>9} {'activations MiB':>16} {'formula':>8} {'err':>6} {'model state MiB':>16} {'formula':>8} "
      f"{'err':>6} {'sent MiB/step':>14} {'formula':>8} {'err':>6}")
for l, tt, sp in (("one", 1, False), ("tp", t, False), ("sp", t, True)):
    acts, state, sent = formulas(tt, sp)
    m_act, m_state = peaks(f"{out}/{l}.1.log")[0]
    m_sent = median_tokens(f"{out}/{l}.1.jsonl")[1]["comm_bytes_per_rank"]
    err = lambda m, f: f"{100 * (m - f) / f:+.1f}%" if f else "  -"
    name = {"one": "tp=1", "tp": f"tp={t}", "sp": f"tp={t} sp"}[l]
    print(f"{name:>9} {m_act / 2**20:>16.2f} {acts / 2**20:>8.2f} {err(m_act, acts):>6} "
          f"{m_state / 2**20:>16.2f} {state / 2**20:>8.2f} {err(m_state, state):>6} "
          f"{m_sent / 2**20:>14.2f} {sent / 2**20:>8.2f} {err(m_sent, sent):>6}")
PY
