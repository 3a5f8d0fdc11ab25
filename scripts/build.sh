#!/usr/bin/env bash
# Configures and builds tessera into build/ (Release). `--target NAME` (repeatable) builds just
# those targets (the main job builds only the command); other arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
cmake_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --target) targets+=(--target "${2:?--target needs a name}"); shift 2 ;;
    *) cmake_args+=("$1"); shift ;;
  esac
done
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" >/dev/null
cmake --build build -j"$(nproc)" "${targets[@]}"
