#!/usr/bin/env bash
# Fuzzes every parser of outside bytes with libFuzzer (docs/RELIABILITY.md):
#   1. builds tests/fuzz/fuzz_* with clang, AddressSanitizer and UndefinedBehaviorSanitizer into
#      build-fuzz/ (-DTESSERA_FUZZ=ON);
#   2. runs each target in turn, splitting FUZZ_SECONDS between them, starting from the
#      checked-in corpus plus seeds written by tessera's own writers (fuzz_make_seeds);
#   3. merges (-merge=1, which minimises) the corpus, the seeds and the new inputs back into
#      tests/fuzz/corpus/<target>/;
#   4. lists every finding (crash, sanitizer report, timeout, out-of-memory, oversized malloc)
#      under build-fuzz/findings/<target>/ and exits 1 when there is one. Fix it, then copy the
#      input to tests/fuzz/regressions/<target>/ so the replay tests keep checking it.
#
# Usage: scripts/fuzz.sh [TARGET...]     (default: all targets)
# Environment (defaults in brackets):
#   FUZZ_SECONDS    total fuzzing time over all targets [600]
#   FUZZ_MAX_LEN    largest input in bytes [16384]
#   FUZZ_RSS_MB     memory limit of a fuzzing process [2048]
#   FUZZ_MALLOC_MB  largest single allocation; more is a finding (unbounded allocation) [256]
#   FUZZ_TIMEOUT    seconds one input may take; more is a finding (hang) [10]
#   FUZZ_NO_MERGE=1 leave tests/fuzz/corpus unchanged
# Runs under `nice -n 10`: the machine is shared.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

all_targets=(checkpoint hf_config hf_tokenizer raw_tokens safetensors safetensors_index token_file tokenizer train_config)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (known: ${all_targets[*]})" >&2; exit 2; }
done

total=${FUZZ_SECONDS:-600}
max_len=${FUZZ_MAX_LEN:-16384}
rss_mb=${FUZZ_RSS_MB:-2048}
malloc_mb=${FUZZ_MALLOC_MB:-256}
timeout=${FUZZ_TIMEOUT:-10}
per_target=$(( total / ${#targets[@]} ))
[ "$per_target" -ge 1 ] || per_target=1

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is needed (apt-get install clang)" >&2; exit 2; }
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

echo "== building the fuzz targets (clang, ASan + UBSan, libFuzzer) into build-fuzz/"
cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTESSERA_FUZZ=ON -DTESSERA_SANITIZE=address,undefined -DTESSERA_WERROR=ON \
  -DTESSERA_MPI=OFF -DTESSERA_BENCH=OFF -DTESSERA_NATIVE=OFF "${launcher[@]}" >/dev/null
build_targets=(fuzz_make_seeds)
for t in "${targets[@]}"; do build_targets+=("fuzz_$t"); done
CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} nice -n 10 cmake --build build-fuzz -j"$(nproc)" \
  --target "${build_targets[@]}"

work=$root/build-fuzz/run
rm -rf "$work"
mkdir -p "$work" "$root/build-fuzz/findings"
# The targets write each input to a scratch file; in memory (/dev/shm) that is ~5x faster.
shm=/dev/shm
[ -d "$shm" ] && [ -w "$shm" ] || shm=$work
scratch=$(mktemp -d "$shm/tessera-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
./build-fuzz/tests/fuzz/fuzz_make_seeds "$work/seeds"

bytes_in() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }

findings=0
for t in "${targets[@]}"; do
  bin=./build-fuzz/tests/fuzz/fuzz_$t
  corpus=tests/fuzz/corpus/$t
  found=$root/build-fuzz/findings/$t
  rm -rf "$found"
  mkdir -p "$corpus" "$work/new/$t" "$found"
  dict=()
  [ "$t" != raw_tokens ] && [ "$t" != token_file ] && dict=(-dict=tests/fuzz/json.dict)
  regressions=()
  [ -d "tests/fuzz/regressions/$t" ] && regressions=("tests/fuzz/regressions/$t")
  echo "== fuzz_$t: ${per_target} s"
  # New inputs go to the first directory; the others are read. Findings are written under
  # $found. libFuzzer stops at the first finding; the remaining time is not retried.
  status=0
  nice -n 10 "$bin" "$work/new/$t" "$corpus" "$work/seeds/$t" "${regressions[@]}" "${dict[@]}" \
    -max_total_time="$per_target" -max_len="$max_len" -rss_limit_mb="$rss_mb" \
    -malloc_limit_mb="$malloc_mb" -timeout="$timeout" -use_value_profile=1 \
    -artifact_prefix="$found/" -print_final_stats=1 >"$work/$t.log" 2>&1 || status=$?
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb|new_units_added)" \
    "$work/$t.log" || true
  if [ "$status" -ne 0 ]; then
    echo "fuzz_$t found a problem (exit $status); the log: $work/$t.log"
    grep -E "ERROR|SUMMARY|==[0-9]+==|Test unit written" "$work/$t.log" | head -20 || true
  fi
  if [ "${FUZZ_NO_MERGE:-0}" != 1 ]; then
    # A merge into an empty directory keeps a small set of inputs with the same edge coverage
    # (-use_counters=0: hit counts are not features here, which keeps the corpus small).
    rm -rf "$work/merged/$t" && mkdir -p "$work/merged/$t"
    nice -n 10 "$bin" -merge=1 "$work/merged/$t" "$corpus" "$work/seeds/$t" "$work/new/$t" \
      -max_len="$max_len" -rss_limit_mb="$rss_mb" -malloc_limit_mb="$malloc_mb" \
      -timeout="$timeout" -use_counters=0 >"$work/$t.merge.log" 2>&1 ||
      { echo "merge of fuzz_$t failed; the log: $work/$t.merge.log"; status=1; }
    if [ -n "$(ls -A "$work/merged/$t")" ]; then
      rm -f "$corpus"/*
      cp "$work/merged/$t"/* "$corpus"/
    fi
    echo "   corpus: $(ls "$corpus" | wc -l) inputs, $(bytes_in "$corpus") bytes"
  fi
  if [ -n "$(ls -A "$found")" ]; then
    findings=1
    echo "   findings in $found:"
    ls -l "$found" | tail -n +2 | sed 's/^/     /'
  fi
done

echo "== corpus total: $(bytes_in tests/fuzz/corpus) bytes"
if [ "$findings" -ne 0 ]; then
  echo "fuzz.sh: findings above; reproduce one with build-fuzz/tests/fuzz/fuzz_<target> FILE"
  exit 1
fi
echo "fuzz.sh: no findings"
