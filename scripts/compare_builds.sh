#!/usr/bin/env bash
# Trains a grid of 33 layouts with the `tessera` command built from two sources (a commit, and the
# working tree) on this machine, and checks that each layout ends with bitwise the same weights
# and optimizer state and prints the same losses. For refactors that must not change what is
# computed: the bits depend on this CPU's BLAS kernels, so the two builds are compared side by
# side rather than against stored numbers.
#
# Usage: scripts/compare_builds.sh [--ref COMMIT] [--only REGEX] [--keep]
#   --ref COMMIT   the reference (default: HEAD); built once into build-ref/<sha> and kept
#   --only REGEX   run only the layouts whose name matches (grep -E)
#   --keep         keep the runs' directories (out/compare-builds/...)
# Needs the packages of scripts/install-deps.sh. Exit status 0 when every layout matched.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=HEAD only="" keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ref) ref="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_builds: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
sha=$(git rev-parse --verify "$ref^{commit}") || { echo "compare_builds: no commit '$ref'" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=$(nproc)

# The reference command: a worktree of the commit, built once (only the command).
ref_dir="build-ref/$sha"
ref_bin="$ref_dir/build/apps/tessera/tessera"
if [ ! -x "$ref_bin" ]; then
  echo "== building the reference command ($ref = ${sha:0:10}) in $ref_dir"
  rm -rf "$ref_dir"
  mkdir -p build-ref
  git worktree prune
  git worktree add --detach "$ref_dir/src" "$sha" >/dev/null
  cmake -S "$ref_dir/src" -B "$ref_dir/build" -DCMAKE_BUILD_TYPE=Release -DTESSERA_BENCH=OFF >/dev/null
  cmake --build "$ref_dir/build" -j"$jobs" --target tessera >/dev/null
  git worktree remove --force "$ref_dir/src"
fi
echo "== building the working tree's command in build/"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs" --target tessera >/dev/null
new_bin=build/apps/tessera/tessera

out="out/compare-builds/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
# A small model on the default corpus (its tokenizer prepared once, shared by both builds), one
# compute thread per rank, validation and sampling off: 3 steps of 2 micro-batches per rank.
common=(--layers 4 --dim 64 --heads 4 --seq 32 --vocab 320 --steps 3 --warmup 1 --lr 1e-2
        --eval-every 0 --val-fraction 0 --sample-tokens 0 --threads 1 --seed 7
        --cache-dir "$out/cache")
# name | flags (dp x tp x pp ranks run as threads; "mpirun:" runs them as MPI processes)
layouts=(
  "one-rank|--batch 8 --micro-batch 4"
  "one-rank-dropout|--batch 8 --micro-batch 4 --dropout 0.1"
  "dp2-zero0|--dp 2 --batch 8 --micro-batch 2"
  "dp2-zero1|--dp 2 --batch 8 --micro-batch 2 --zero 1"
  "dp2-zero2|--dp 2 --batch 8 --micro-batch 2 --zero 2 --bucket-mb 0.05"
  "dp2-zero3|--dp 2 --batch 8 --micro-batch 2 --zero 3 --bucket-mb 0.05 --dropout 0.1"
  "dp2-no-overlap|--dp 2 --batch 8 --micro-batch 2 --overlap false --zero 1"
  "tp2|--tp 2 --batch 8 --micro-batch 4"
  "tp2-sp-dropout|--tp 2 --sp --batch 8 --micro-batch 4 --dropout 0.1"
  "dp2-tp2-sp-zero3|--dp 2 --tp 2 --sp --batch 8 --micro-batch 2 --zero 3 --bucket-mb 0.05"
  "pp2-gpipe|--pp 2 --schedule gpipe --batch 8 --micro-batch 2"
  "pp2-1f1b-dropout|--pp 2 --schedule 1f1b --batch 8 --micro-batch 2 --dropout 0.1"
  "pp2-interleaved|--pp 2 --schedule interleaved --virtual-stages 2 --batch 8 --micro-batch 2"
  "pp2-zb-h1|--pp 2 --schedule zb-h1 --batch 8 --micro-batch 2 --dropout 0.1"
  "pp2-mid-block|--pp 2 --pp-split 2.5,3.5 --batch 8 --micro-batch 2"
  "pp2-zb-zero3|--pp 2 --dp 2 --schedule zb-h1 --zero 3 --bucket-mb 0.05 --batch 8 --micro-batch 2"
  "3d-dp2-tp2-pp2|--dp 2 --tp 2 --sp --pp 2 --zero 1 --batch 8 --micro-batch 2 --dropout 0.1"
  "recompute-selective|--dp 2 --batch 8 --micro-batch 2 --recompute selective --dropout 0.1"
  "recompute-full-pp|--pp 2 --schedule zb-h1 --recompute full --batch 8 --micro-batch 2 --dropout 0.1"
  "moe-ep2|--dp 2 --ep 2 --moe-experts 4 --batch 8 --micro-batch 2"
  "moe-ep2-tp2-zero2|--dp 2 --ep 2 --tp 2 --sp --moe-experts 4 --moe-every 2 --zero 2 --bucket-mb 0.05 --batch 8 --micro-batch 2"
  "moe-full-zb|--pp 2 --dp 2 --ep 2 --moe-experts 4 --schedule zb-h1 --recompute full --batch 8 --micro-batch 2 --dropout 0.1"
  "tp2-sp-selective-zb|--tp 2 --sp --pp 2 --schedule zb-h1 --recompute selective --batch 8 --micro-batch 2 --dropout 0.1"
  "moe-pp2-capacity|--pp 2 --moe-experts 4 --moe-capacity-factor 1.25 --batch 8 --micro-batch 2 --dropout 0.1"
  "bf16-emulated-tp2|--tp 2 --precision bf16 --bf16-gemm emulated --batch 8 --micro-batch 4"
  "bf16-emulated-dp2-zero3|--dp 2 --zero 3 --precision bf16 --bf16-gemm emulated --batch 8 --micro-batch 2"
  "bf16-full-tp2-sp|--tp 2 --sp --recompute full --precision bf16 --bf16-gemm emulated --batch 8 --micro-batch 4 --dropout 0.1"
  "bf16-pp2-zb|--pp 2 --schedule zb-h1 --precision bf16 --bf16-gemm emulated --batch 8 --micro-batch 2"
  "sgd-clip|--dp 2 --optimizer sgd --grad-clip 0.05 --batch 8 --micro-batch 2"
  "mpirun:dp2-tp2|--dp 2 --tp 2 --zero 1 --batch 8 --micro-batch 2"
  "mpirun:pp2-1f1b|--pp 2 --batch 8 --micro-batch 2 --dropout 0.1"
)
# bf16 through oneDNN where this CPU has bf16 units (auto would measure, and could choose either).
if "$new_bin" train --help >/dev/null 2>&1 && grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  layouts+=("bf16-onednn-dp2|--dp 2 --precision bf16 --bf16-gemm onednn --batch 8 --micro-batch 2")
  layouts+=("bf16-onednn-pp2|--pp 2 --precision bf16 --bf16-gemm onednn --batch 8 --micro-batch 2")
fi

ranks_of() {  # dp x tp x pp of a flag list
  local dp=1 tp=1 pp=1 a prev=""
  for a in "$@"; do
    case "$prev" in --dp) dp=$a ;; --tp) tp=$a ;; --pp) pp=$a ;; esac
    prev=$a
  done
  echo $((dp * tp * pp))
}

run_one() {  # bin dir flags...
  local bin=$1 dir=$2 mpi=$3
  shift 3
  mkdir -p "$dir"
  local cmd=("$bin" train "${common[@]}" "$@" --save "$dir/ckpt" --metrics "$dir/metrics.jsonl")
  if [ "$mpi" = 1 ]; then
    cmd=(mpirun --oversubscribe -np "$(ranks_of "$@")" "${cmd[@]}")
  fi
  "${cmd[@]}" >"$dir/log" 2>&1
}

# The training losses of a metrics file, one per line, as printed (JSON numbers round-trip).
losses() { grep -o '"loss":[^,}]*' "$1" || true; }

failed=0 ran=0
for entry in "${layouts[@]}"; do
  name=${entry%%|*}
  flags=${entry#*|}
  [ -n "$only" ] && ! echo "$name" | grep -qE "$only" && continue
  mpi=0
  case "$name" in mpirun:*) mpi=1 ;; esac
  dir_name=${name#mpirun:}
  read -r -a f <<<"$flags"
  ran=$((ran + 1))
  status=""
  if ! run_one "$ref_bin" "$out/$dir_name/ref" "$mpi" "${f[@]}"; then
    status="reference run failed (see $out/$dir_name/ref/log)"
  elif ! run_one "$new_bin" "$out/$dir_name/new" "$mpi" "${f[@]}"; then
    status="new run failed (see $out/$dir_name/new/log)"
  else
    for file in model.safetensors; do
      cmp -s "$out/$dir_name/ref/ckpt/$file" "$out/$dir_name/new/ckpt/$file" ||
        status="$status $file differs;"
    done
    ref_step=$(ls -d "$out/$dir_name/ref/ckpt"/step-* | tail -1)
    new_step=$(ls -d "$out/$dir_name/new/ckpt"/step-* | tail -1)
    for file in model.safetensors optimizer.safetensors; do
      cmp -s "$ref_step/$file" "$new_step/$file" || status="$status checkpoint $file differs;"
    done
    [ "$(losses "$out/$dir_name/ref/metrics.jsonl")" = "$(losses "$out/$dir_name/new/metrics.jsonl")" ] ||
      status="$status losses differ;"
  fi
  if [ -z "$status" ]; then
    printf '  %-26s bitwise equal (final loss %s)\n' "$name" \
      "$(losses "$out/$dir_name/new/metrics.jsonl" | tail -1 | cut -d: -f2)"
  else
    printf '  %-26s DIFFERS:%s\n' "$name" "$status"
    failed=$((failed + 1))
  fi
done
[ "$keep" = 1 ] || rm -rf "$out"
if [ "$failed" -gt 0 ]; then
  echo "compare_builds: $failed of $ran layouts differ from ${sha:0:10}"
  exit 1
fi
echo "compare_builds: all $ran layouts bitwise equal to ${sha:0:10}"
