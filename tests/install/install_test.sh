#!/usr/bin/env bash
# tessera as a library, from outside (tests/install/CMakeLists.txt):
#   install   `cmake --install` into PREFIX; the package files are there, the internals are not
#   headers   a separate project (copied out of the source tree) finds the package in PREFIX and
#             compiles alone, each in its own translation unit, the installed headers that
#             tessera's build does not (BUILD_DIR/tessera_headers_alone.txt: those without a .cc
#             that includes them first); TESSERA_CHECK_ALL_HEADERS=1: every installed header
#   examples  the same with the three examples copied out of the source tree: build, then run
#   install_test.sh STEP BUILD_DIR PREFIX SOURCE_DIR CXX [COMPILER_LAUNCHER] [MPIEXEC]
set -euo pipefail
step=$1 build=$2 prefix=$3 src=$4 cxx=$5 launcher=${6:-} mpiexec=${7:-}
fail() { echo "FAIL: $*"; exit 1; }

if [ "$step" = install ]; then
  rm -rf "$prefix"
  cmake --install "$build" --prefix "$prefix" >/dev/null
  for f in lib/cmake/tessera/tesseraConfig.cmake lib/cmake/tessera/tesseraConfigVersion.cmake \
           lib/cmake/tessera/tesseraTargets.cmake lib/libtessera_core.a lib/libtessera_train.a \
           include/tessera/tessera.h include/tessera/version.h include/tessera/nn/unit_model.h \
           bin/tessera share/doc/tessera/API.md share/doc/tessera/examples/custom_model/main.cc; do
    [ -e "$prefix/$f" ] || fail "$f was not installed"
  done
  for f in tessera/comm/inproc tessera/comm/mpi tessera/comm/reduce.h tessera/kernels/vec_math.h \
           tessera/parallel/pipeline/schedule_builder.h tessera/io/json_parse.h tessera/nn/kept_input.h; do
    [ ! -e "$prefix/include/$f" ] || fail "internal $f was installed"
  done
  echo "PASS: installed $(find "$prefix/include" -name '*.h' | wc -l) headers into $prefix"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera_install_$step.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$src/tests/install/consumer" "$work/consumer"
cp -r "$src/examples" "$work/examples"
case $step in
  headers)
    list=$build/tessera_headers_alone.txt
    [ "${TESSERA_CHECK_ALL_HEADERS:-0}" = 1 ] && list=all
    what=(-DTESSERA_CHECK_HEADERS="$list") ;;
  examples) what=(-DTESSERA_EXAMPLES_DIR="$work/examples") ;;
  *) fail "unknown step $step" ;;
esac
# Only the prefix is searched: no package registry, no source tree.
cmake -S "$work/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_CXX_COMPILER="$cxx" \
  ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"} -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_COMPILE_WARNING_AS_ERROR=ON "${what[@]}" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configure"; }
grep -q "tessera 0.1.0 from $prefix/lib/cmake/tessera" "$work/configure.log" ||
  { cat "$work/configure.log"; fail "find_package(tessera) did not use the installed package"; }
cmake --build "$work/build" -j2 >"$work/build.log" 2>&1 ||
  { grep -E -A5 "error|Error" "$work/build.log" | head -60; fail "build"; }

if [ "$step" = headers ]; then
  echo "PASS: $(grep -o "headers to compile alone: [0-9]*" "$work/configure.log"), each compiled"
  exit 0
fi

cd "$work"
"$work/build/allreduce_bench/allreduce_bench" 2 | tee bench.txt
[ "$(grep -c 'GB/s' bench.txt)" -eq 7 ] || fail "allreduce_bench printed no table"
if [ -n "$mpiexec" ]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "$mpiexec" -n 2 --oversubscribe "$work/build/allreduce_bench/allreduce_bench" | tee mpi.txt
  [ "$(grep -c 'GB/s' mpi.txt)" -eq 7 ] || fail "allreduce_bench under mpirun printed no table"
fi
"$work/build/custom_model/custom_model" | tee custom.txt || fail "custom_model"
grep -q "(the same model)" custom.txt || fail "custom_model: dp=2 ZeRO-3 differs from one rank"
"$work/build/train_gpt/train_gpt" | tee train.txt || fail "train_gpt"
grep -q "tp 2 | pp 2" train.txt || fail "train_gpt did not run the 2 x 2 x 2 layout"
echo "PASS: the three examples built and ran"
