#!/usr/bin/env bash
# Every test: install what is needed, build with warnings as errors, run the whole suite, then
# rerun it under AddressSanitizer + UndefinedBehaviorSanitizer (MPI tests included, without leak
# checking), and the in-process communicator's tests and the threaded kernels under
# ThreadSanitizer. Set TESSERA_TEST_QUICK=1 to skip the sanitizer builds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=$(nproc)

echo "== Release build, warnings as errors"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTESSERA_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 600)

if [ "${TESSERA_TEST_QUICK:-0}" != "1" ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_WERROR=ON \
    -DTESSERA_SANITIZE=address,undefined -DTESSERA_BENCH=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs" \
    --timeout 900 -LE mpi)
  # The MPI tests too, with leak checking off: Open MPI keeps allocations to process exit (in
  # components it unloads, so they cannot be suppressed by name). Memory errors and undefined
  # behaviour are still fatal.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure --timeout 900 -L mpi)

  echo "== ThreadSanitizer on the in-process communicator"
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_WERROR=ON \
    -DTESSERA_SANITIZE=thread -DTESSERA_BENCH=OFF >/dev/null
  cmake --build build-tsan -j"$jobs" --target test_comm test_comm_faults test_kernels
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j"$jobs" \
    --timeout 900 -L inproc)
  echo "== ThreadSanitizer on the threaded kernels (fused attention, parallel rows)"
  # Not the bf16 test: oneDNN's OpenMP runtime is not instrumented (reports inside libdnnl).
  TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/kernels/test_kernels \
    --gtest_filter='FlashAttention.*:ParallelRows*:-FlashAttention.Bf16GemmModeIsClose'

fi
