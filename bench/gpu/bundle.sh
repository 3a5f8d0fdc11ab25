#!/usr/bin/env bash
# Packs the GPU check's binaries (test_cuda, gpt2_speed, tessera) with the shared libraries they
# need that a bare CUDA machine lacks (OpenBLAS and its Fortran runtime, libgomp, SentencePiece,
# PCRE2; not libstdc++: the machine's own is newer, and its other libraries need it) and
# the default corpus (Debian's fortunes), for bench/gpu/check.sh --bundle on a machine without the
# Debian packages. Builds build-gpu-bundle for a generic x86-64 CPU (no -march=native: the device
# machine's CPU differs) without MPI or oneDNN.
#   bench/gpu/bundle.sh OUT.tar.xz
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: bundle.sh OUT.tar.xz}")
cmake -S . -B build-gpu-bundle -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_NATIVE=OFF \
  -DTESSERA_MPI=OFF -DTESSERA_ONEDNN=OFF -DTESSERA_BENCH=ON -DTESSERA_WERROR=ON >/dev/null
cmake --build build-gpu-bundle --target test_cuda gpt2_speed kernel_speed tessera -j"$(nproc)"
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib" "$stage/data"
cp build-gpu-bundle/tests/cuda/test_cuda build-gpu-bundle/bench/gpu/gpt2_speed \
  build-gpu-bundle/bench/gpu/kernel_speed build-gpu-bundle/apps/tessera/tessera "$stage/bin/"
strip "$stage/bin/"*
cp -r /usr/share/games/fortunes "$stage/data/"
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libgomp.so.1 libsentencepiece.so.0 \
  libpcre2-8.so.0 libz.so.1; do
  path=$(ldd "$stage/bin/tessera" "$stage/bin/test_cuda" | awk -v l="$lib" '$1 == l { print $3 }' |
    head -1)
  [[ -n "$path" ]] && cp -L "$path" "$stage/lib/"
done
tar -cJf "$out" -C "$stage" bin lib data
rm -rf "$stage"
ls -la "$out"
