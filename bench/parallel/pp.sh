#!/usr/bin/env bash
# Pipeline parallelism, measured (issue 10). Usage: bench/parallel/pp.sh [path/to/tessera]
# GPT L=6 C=512 heads 8 T=256 V=4096, global batch 16 sequences, one thread per rank.
#  1. tokens/s: pp=2 with 8 micro-batches of 2 (gpipe, 1f1b, zb-h1) against one rank (one thread),
#     both with micro-batches of 2 and with the whole batch at once; the runs are interleaved
#     (one round = every configuration once), ROUNDS rounds (default 3); medians and per-round
#     ratios.
#  2. the bubble of each pipeline run measured on its --trace timeline (per step: a rank's idle
#     share of the span from the step's first compute action to its last, the simulator's
#     definition) against `tessera schedule`'s simulation with the F, B (BI) and W costs measured
#     per rank on the same timeline.
# Timings want a quiet machine: run nothing else meanwhile. SMOKE=1 runs a tiny model (checks the
# script, measures nothing).
set -euo pipefail
bin=${1:-build/apps/tessera/tessera}
rounds=${ROUNDS:-3}
steps=${STEPS:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=(--layers 6 --dim 512 --heads 8 --seq 256)
[ "${SMOKE:-0}" = 1 ] && model=(--layers 4 --dim 64 --heads 4 --seq 32)  # checks the script only
args=(--cache-dir "$out/cache" --vocab 4096 --val-fraction 0 --eval-every 0 --sample-tokens 0
      "${model[@]}" --batch 16 --steps "$steps" --warmup 1 --threads 1)
configs=("one_mb2:--micro-batch 2" "one_mb16:--micro-batch 16"
         "gpipe:--pp 2 --micro-batch 2 --schedule gpipe"
         "1f1b:--pp 2 --micro-batch 2 --schedule 1f1b"
         "zb-h1:--pp 2 --micro-batch 2 --schedule zb-h1")
"$bin" train "${args[@]}" --steps 1 >/dev/null  # tokenizer cache, so no run pays for it
for r in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    name=${c%%:*}
    read -r -a flags <<<"${c#*:}"
    extra=()
    [[ $name == one_* ]] || extra=(--trace "$out/$name.$r.json")
    "$bin" train "${args[@]}" "${flags[@]}" "${extra[@]}" >"$out/$name.$r.log"
    echo "round $r $name: $(grep '^done' "$out/$name.$r.log")"
  done
done
python3 - "$out" "$rounds" "$bin" <<'PY'
import json, re, statistics, subprocess, sys
out, rounds, tessera = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = ["one_mb2", "one_mb16", "gpipe", "1f1b", "zb-h1"]
def tok(name, r):
    return float(re.search(r"done: \d+ steps, ([0-9.]+) tokens/s", open(f"{out}/{name}.{r}.log").read()).group(1))
t = {n: [tok(n, r) for r in range(1, rounds + 1)] for n in names}
print("\n== 1. tokens/s (median of %d interleaved rounds; one rank = the faster of its two runs)" % rounds)
for n in names:
    print(f"{n:>9}: median {statistics.median(t[n]):8.1f} tokens/s  runs {' '.join(f'{x:.1f}' for x in t[n])}")
for n in ["gpipe", "1f1b", "zb-h1"]:
    per_round = [t[n][i] / max(t["one_mb2"][i], t["one_mb16"][i]) for i in range(rounds)]
    met = sum(x >= 1.7 for x in per_round)
    print(f"{n:>9} / one rank: median {statistics.median(per_round):.2f}x, rounds "
          f"{' '.join(f'{x:.2f}' for x in per_round)}; >= 1.7x in {met} of {rounds}")
zb_wins = sum(t["zb-h1"][i] > t["1f1b"][i] for i in range(rounds))
print(f"    zb-h1 / 1f1b: median {statistics.median([t['zb-h1'][i] / t['1f1b'][i] for i in range(rounds)]):.3f}x; "
      f"zb-h1 faster in {zb_wins} of {rounds} rounds")

print("\n== 2. bubble: measured on the timeline vs simulated from the measured costs")
COMPUTE = {"forward": "F", "backward": "B", "backward-input": "BI", "backward-weight": "W"}
for n in ["gpipe", "1f1b", "zb-h1"]:
    rows = []
    for r in range(1, rounds + 1):
        ev = json.load(open(f"{out}/{n}.{r}.json"))
        ev = ev["traceEvents"] if isinstance(ev, dict) else ev
        acts = [e for e in ev if e.get("ph") == "X" and e.get("tid") == 2 and e.get("cat") in COMPUTE]
        steps = {}  # step k: actions; a rank's k-th "F0" starts its k-th step
        count = {}
        for e in sorted(acts, key=lambda e: e["ts"]):
            if e["name"] == "F0":
                count[e["pid"]] = count.get(e["pid"], 0) + 1
            steps.setdefault(count.get(e["pid"], 0), []).append(e)
        ranks = sorted({e["pid"] for e in acts})
        measured, costs = [], {p: {"F": [], "B": [], "BI": [], "W": []} for p in ranks}
        for k in sorted(steps)[1:]:  # the first step allocates
            a = steps[k]
            t0 = min(e["ts"] for e in a)
            t1 = max(e["ts"] + e["dur"] for e in a)
            for p in ranks:
                busy = sum(e["dur"] for e in a if e["pid"] == p)
                measured.append((p, 1 - busy / (t1 - t0)))
            for e in a:
                costs[e["pid"]][COMPUTE[e["cat"]]].append(e["dur"])
        m_overall = statistics.mean(b for _, b in measured)
        triples = []
        for p in ranks:
            c = costs[p]
            F = statistics.median(c["F"])
            if c["W"]:
                W = statistics.median(c["W"]); B = statistics.median(c["BI"]) + W
            else:
                B = statistics.median(c["B"]); W = B / 2  # unused without a split backward
            # one micro-batch through the rank's layers, in microseconds
            triples.append(f"{F:.1f},{B:.1f},{W:.1f}")
        sim = subprocess.run([tessera, "schedule", "--pp", str(len(ranks)), "--micro-batches", "8",
                              "--schedule", n, "--costs", "/".join(triples)],
                             capture_output=True, text=True, check=True).stdout
        s_overall = float(re.search(r"bubble: ([0-9.]+)% of the step idle overall", sim).group(1)) / 100
        rows.append((m_overall, s_overall, "/".join(triples)))
    for m, s, tr in rows:
        print(f"{n:>6}: measured {100 * m:5.1f}%  simulated {100 * s:5.1f}%  difference "
              f"{100 * (m - s):+5.1f} points  (costs us F,B,W per rank: {tr})")
    within = sum(abs(m - s) <= 0.05 for m, s, _ in rows)
    print(f"{n:>6}: within 5 points in {within} of {len(rows)} rounds")
PY
