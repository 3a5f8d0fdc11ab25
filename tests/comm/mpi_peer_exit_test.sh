#!/usr/bin/env bash
# A process that dies without MPI_Finalize never hangs the job (issue 3, MPI failure behaviour):
#  1. by default mpirun sees the non-zero exit and terminates the other processes;
#  2. told not to (orte_abort_on_non_zero_status 0), the survivors' all_reduce times out within
#     its 3 s deadline with an error that names the op and the neighbours waited for.
# Usage: mpi_peer_exit_test.sh MPIEXEC MPI_PEER_EXIT_BINARY
set -u
mpiexec="$1"
bin="$2"
fail() { echo "FAIL: $*"; exit 1; }
for np in 2 3; do
  start=$(date +%s)
  out=$(timeout 60 "$mpiexec" --oversubscribe -n "$np" "$bin" 2>&1)
  rc=$?
  took=$(($(date +%s) - start))
  echo "$out"
  [[ $rc -ne 124 ]] || fail "np=$np: the job hung (killed after 60 s)"
  [[ $rc -ne 0 ]] || fail "np=$np: mpiexec returned 0 although a process died"
  [[ $took -lt 30 ]] || fail "np=$np: the job took ${took} s to end"
  echo "ok: np=$np, mpirun ended the job in ${took} s with status $rc"

  start=$(date +%s)
  out=$(timeout 60 "$mpiexec" --oversubscribe --mca orte_abort_on_non_zero_status 0 -n "$np" \
        "$bin" 2>&1)
  rc=$?
  took=$(($(date +%s) - start))
  echo "$out"
  [[ $rc -ne 124 ]] || fail "np=$np: survivors hung (killed after 60 s)"
  [[ $took -lt 30 ]] || fail "np=$np: survivors took ${took} s to fail"
  survivors=$(grep -c "failed as expected: all_reduce #2 (F32 x 1048576, sum) on communicator 'world' rank [0-9]/$np: timed out after 3000 ms waiting for ring neighbour" <<<"$out")
  [[ $survivors -eq $((np - 1)) ]] || fail "np=$np: expected $((np - 1)) survivors to time out, saw $survivors"
  ! grep -q UNEXPECTED <<<"$out" || fail "np=$np: an all_reduce with a dead peer completed"
  echo "ok: np=$np, $survivors survivor(s) timed out with a clear error in ${took} s"
done
echo "PASS"
