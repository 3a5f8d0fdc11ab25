#!/usr/bin/env bash
# The GPU check (issue 35): on a machine with a CUDA device, runs the CUDA tests (every kernel
# against the CPU kernel; the device model against the CPU model in fp32 within 1e-4, alone and as
# data-parallel thread ranks sharing the device) and prints GPT-2 124M's training tokens/s and MFU
# at B=16 T=1024 in bf16. Under 8 minutes on an H200.
#
#   bench/gpu/check.sh                  configure and build build-gpu here (needs the README's
#                                       packages and the CUDA toolkit), then run
#   bench/gpu/check.sh --bundle F.tar.xz   run the binaries and libraries packed by
#                                       bench/gpu/bundle.sh on another machine (a lent device
#                                       without the Debian packages)
# Logs and the test report go to $OUT (default: runs/gpu-check). GPU_CHECK_PROFILE=1 adds a
# profiled run of the speed benchmark (its time per operation); GPU_CHECK_TESTS=filter runs only
# the CUDA tests that match a GoogleTest filter.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
bundle=""
if [[ "${1:-}" == "--bundle" ]]; then bundle=${2:?--bundle needs a file}; fi

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "check.sh: no CUDA device here (nvidia-smi -L failed)" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv |
  tee "$OUT/device.txt"

if [[ -n "$bundle" ]]; then
  dir=$(mktemp -d)
  tar -xJf "$bundle" -C "$dir"
  bin=$dir/bin
  data=$dir/data/fortunes
  # cuBLAS and NCCL from the device's toolkit or from the Python wheels that carry them (tessera
  # opens libcublas.so.13, beside libcublasLt, through this LD_LIBRARY_PATH at its first handle).
  extra=""
  for lib in 'libcublasLt.so.13*' 'libnccl.so.2*'; do
    found=$(find /usr/local /opt /usr/lib -maxdepth 9 -name "$lib" -printf '%h\n' 2>/dev/null |
      head -1)
    [[ -n "$found" ]] && extra="$extra:$found"
  done
  export LD_LIBRARY_PATH="$dir/lib${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_BENCH=ON \
    -DTESSERA_MPI=OFF >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
  cmake --build build-gpu --target test_cuda gpt2_speed kernel_speed tessera -j"$(nproc)" >"$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; exit 1; }
  bin=$OUT/bin
  data=""  # the default corpus
  mkdir -p "$bin"
  cp build-gpu/tests/cuda/test_cuda build-gpu/bench/gpu/gpt2_speed build-gpu/bench/gpu/kernel_speed \
    build-gpu/apps/tessera/tessera "$bin/"
fi
for b in test_cuda gpt2_speed tessera; do
  if ldd "$bin/$b" | grep -q 'not found'; then
    echo "check.sh: $b is missing libraries:" >&2
    ldd "$bin/$b" | grep 'not found' >&2
    exit 1
  fi
done

status=0
echo "== CUDA tests"
timeout 300 "$bin/test_cuda" --gtest_filter="${GPU_CHECK_TESTS:-*}" --gtest_output="xml:$OUT/test_cuda.xml" >"$OUT/test_cuda.log" 2>&1
tests_rc=$?
grep -E '^\[ *(OK|FAILED|SKIPPED) *\]|^\[==========\]|PASSED|Failure|error' "$OUT/test_cuda.log" |
  tail -80
[[ $tests_rc -eq 0 ]] || status=1

echo "== the main job on the device: tessera train --device cuda against --device cpu (fp32)"
main=(--steps 40 --eval-every 20 --sample-tokens 0 --cache-dir "$OUT/cache")
[[ -n "$data" ]] && main+=(--data "$data")
for dev in cpu cuda; do
  timeout 240 "$bin/tessera" train --device "$dev" "${main[@]}" >"$OUT/train_$dev.log" 2>&1 ||
    status=1
  tail -4 "$OUT/train_$dev.log"
done

echo "== GPT-2 124M, B=16 T=1024, bf16"
timeout 180 "$bin/gpt2_speed" --batch 16 --seq 1024 --steps 10 --warmup 3 --precision bf16 \
  >"$OUT/gpt2_speed.log" 2>&1
speed_rc=$?
tail -16 "$OUT/gpt2_speed.log"
[[ $speed_rc -eq 0 ]] || status=1
if [[ -n "${GPU_CHECK_PROFILE:-}" ]]; then  # where the step's time goes, operation by operation
  timeout 120 "$bin/gpt2_speed" --batch 16 --seq 1024 --steps 5 --warmup 1 --precision bf16 \
    --profile >"$OUT/gpt2_profile.log" 2>&1
  grep -A40 '^profile' "$OUT/gpt2_profile.log"
  timeout 120 "$bin/kernel_speed" >"$OUT/kernel_speed.log" 2>&1
  cat "$OUT/kernel_speed.log"
fi

echo "== summary"
echo "tests: $(grep -c '^\[       OK \]' "$OUT/test_cuda.log") passed," \
  "$(grep -c '^\[  FAILED  \]' "$OUT/test_cuda.log") failed lines (rc $tests_rc)"
grep -E '^median' "$OUT/gpt2_speed.log" || echo "speed: no result (rc $speed_rc)"
for dev in cpu cuda; do
  echo "train --device $dev: $(grep -oE 'val_loss [0-9.]+' "$OUT/train_$dev.log" | tr '\n' ' ')"
done
exit $status
