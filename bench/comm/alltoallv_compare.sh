#!/usr/bin/env bash
# all_to_allv of the MPI backend against raw MPI_Alltoallv, repeated, for one or more bench_comm
# binaries (e.g. before and after a change), the binaries taking turns within every repeat (the
# order alternates) so that they see the same machine. Each run times the backend and raw MPI
# interleaved iteration by iteration (bench_comm), 2 ranks, 64 KiB .. 4 MiB.
# Usage: bench/comm/alltoallv_compare.sh REPEATS BIN [BIN ...]
# Environment: LOAD=N runs N CPU-bound busy loops meanwhile (a loaded machine; 0 by default);
#              MIN_BYTES, MAX_BYTES (65536, 4194304); NP (2).
# Prints every run's rows, then per binary and size: the median over repeats of the backend's
# and raw MPI's median times, the median ratio, and how many repeats were within 1.2x.
set -euo pipefail
reps="${1:?usage: alltoallv_compare.sh REPEATS BIN [BIN ...]}"
shift
bins=("$@")
[[ ${#bins[@]} -ge 1 ]] || { echo "alltoallv_compare.sh: no binary" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
hogs=()
stop_hogs() { for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for ((i = 0; i < ${LOAD:-0}; i++)); do
  bash -c 'while :; do :; done' &
  hogs+=($!)
done
out="$(mktemp)"
echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)," \
     "LOAD=${LOAD:-0}, $reps repeats"
for ((r = 1; r <= reps; r++)); do
  for ((k = 0; k < ${#bins[@]}; k++)); do
    idx=$(( r % 2 ? k : ${#bins[@]} - 1 - k ))  # alternate the order
    bin="${bins[$idx]}"
    mpirun --oversubscribe --bind-to none -np "${NP:-2}" "$bin" --mpi-only --ops all_to_allv \
      --min-bytes "${MIN_BYTES:-65536}" --max-bytes "${MAX_BYTES:-4194304}" 2>&1 |
      awk -v bin="$idx" -v rep="$r" '($1 == "all_to_allv" || $1 == "mpi_alltoallv") && $2 ~ /^[0-9]+$/ {
        print bin, rep, $1, $2, $4 }' >> "$out"
  done
done
echo "# binary repeat bytes backend_us raw_us ratio"
awk '{ k = $1 " " $2 " " $4; if ($3 == "all_to_allv") b[k] = $5; else r[k] = $5 }
     END { for (k in b) printf "%s %.2f %.2f %.3f\n", k, b[k], r[k], b[k] / r[k] }' "$out" |
  sort -k1,1n -k3,3n -k2,2n | tee "$out.rows"
echo "# summary: binary bytes median_backend_us median_raw_us median_ratio within_1.2x"
for ((k = 0; k < ${#bins[@]}; k++)); do
  for bytes in $(awk -v b="$k" '$1 == b { print $3 }' "$out.rows" | sort -n -u); do
    awk -v b="$k" -v s="$bytes" '$1 == b && $3 == s' "$out.rows" | python3 -c '
import statistics, sys
rows = [l.split() for l in sys.stdin]
med = lambda i: statistics.median(float(r[i]) for r in rows)
ok = sum(float(r[5]) <= 1.2 for r in rows)
print(f"{rows[0][0]} {rows[0][2]:>8} {med(3):10.2f} {med(4):10.2f} {med(5):7.3f} {ok}/{len(rows)}")'
  done
done
for ((k = 0; k < ${#bins[@]}; k++)); do echo "# binary $k: ${bins[$k]}"; done
rm -f "$out" "$out.rows"
