#!/usr/bin/env bash
# The fused attention against the materialising kernel and PyTorch's
# scaled_dot_product_attention(is_causal=True), forward + backward, fp32, one thread, B = 1,
# GPT-2 small's heads (12 x 64), at T = 1K, 4K and 16K: the three interleaved in each round (a
# fresh process each, so that each one's peak memory is its own) so that machine drift hits them
# alike. The materialising kernel holds [heads, T, T] probabilities and [T, T] of scratch: at 16K
# that is 13 GiB for 12 heads, so it runs there with MAT16K_HEADS heads (2: 3 GiB) and its time is
# given for those. Prints each run's JSON line, then per T the medians over the rounds (each
# round's own figure is the median of its repeats) and each round's PyTorch / fused time ratio.
#
# Usage: bench/attention/run.sh [build dir (build)] [python with torch (/work/pyref/bin/python)]
#   env: ROUNDS (3), REPEATS (3; 2 at 16K), TS ("1024 4096 16384"), MAT16K_HEADS (2),
#        IMPLS ("flash materialising torch")
# Takes ~10 minutes on 2 cores at the defaults; wants a quiet machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(realpath "${1:-$here/../../build}")
py=${2:-/work/pyref/bin/python}
bin="$build/bench/attention/bench_attention"
rounds=${ROUNDS:-3}
mat16k=${MAT16K_HEADS:-2}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "$(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc);" \
  "$("$py" -c 'import torch; print("torch", torch.__version__)')"
for r in $(seq 1 "$rounds"); do
  for T in ${TS:-1024 4096 16384}; do
    reps=${REPEATS:-3}
    [ "$T" -ge 16384 ] && reps=${REPEATS:-2}
    mat_heads=12
    [ "$T" -ge 16384 ] && mat_heads=$mat16k
    for impl in ${IMPLS:-flash materialising torch}; do
      if [ "$impl" = torch ]; then
        line=$(OMP_NUM_THREADS=1 "$py" "$here/torch_sdpa.py" "$T" 12 64 "$reps")
      elif [ "$impl" = materialising ]; then
        line=$("$bin" materialising "$T" "$mat_heads" 64 "$reps")
      else
        line=$("$bin" flash "$T" 12 64 "$reps")
      fi
      echo "round $r $line (load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$log"
    done
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r = int(line.split()[1])
    j = json.loads(line[line.index("{"):line.rindex("}") + 1])
    runs.setdefault((j["T"], j["impl"]), {})[r] = j
print("medians over the rounds of each round's median, wall clock (CPU time); extra memory MiB")
print("T      fused s         MiB | materialising s (heads)     MiB | torch s          MiB | "
      "torch / fused, wall (CPU) per round")
for T in sorted({t for t, _ in runs}):
    f, m, t = (runs.get((T, i), {}) for i in ("flash", "materialising", "torch"))
    if not f:
        continue
    med = lambda d, k: statistics.median(x[k] for x in d.values()) if d else float("nan")
    mib = lambda d: max(x["extra_mib"] for x in d.values()) if d else float("nan")
    heads = next(iter(m.values()))["heads"] if m else 0
    col = lambda d: f"{med(d, 'median_s'):7.3f} ({med(d, 'median_cpu_s'):7.3f}) {mib(d):7.1f}"
    ratios = [(t[r]["median_s"] / f[r]["median_s"], t[r]["median_cpu_s"] / f[r]["median_cpu_s"])
              for r in sorted(f) if r in t]
    text = " ".join(f"{w:.2f} ({c:.2f})" for w, c in ratios)
    if ratios:
        text += (f"; median {statistics.median(w for w, _ in ratios):.2f}x"
                 f" ({statistics.median(c for _, c in ratios):.2f}x)")
    print(f"{T:<6} {col(f)} | {col(m)} ({heads:2d}) | {col(t)} | {text}")
PY
