# shellcheck shell=bash
# Helpers of the tests on the test cluster (cluster_*_test.sh; scripts/cluster.sh,
# docs/CLUSTER.md), sourced by them. Each test sets TESSERA_CLUSTER_PREFIX to a prefix of its own
# (tsrs, tsrt, tsrf) and its own subnet, so it does not touch a cluster someone brought up by hand.
# The sourcing test sets $bin (the tessera binary) and $dir (its temporary folder).
# shellcheck disable=SC2154
cluster_sh="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/cluster.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
checks=0
ok() { echo "ok   $1"; checks=$((checks + 1)); }
fail() {
  echo "FAIL $1"
  [ -n "${2:-}" ] && [ -f "$2" ] && tail -25 "$2"
  checks=$((checks + 1))
  failures=$((failures + 1))
}

cluster() { bash "$cluster_sh" "$@"; }

# Exits 77 (SKIPPED) unless this runs as root, can make network namespaces and has mpirun.
skip_unless_possible() {
  [ "$(id -u)" = 0 ] || { echo "SKIPPED: the test cluster needs root"; exit 77; }
  command -v mpirun >/dev/null || { echo "SKIPPED: no mpirun"; exit 77; }
  command -v tc >/dev/null || { echo "SKIPPED: no tc (iproute2)"; exit 77; }
  local probe="tsrprobe$$"
  ip netns add "$probe" 2>/dev/null || { echo "SKIPPED: cannot create network namespaces here"; exit 77; }
  ip netns del "$probe"
}

# cluster_up N [cluster.sh up options]: the test's cluster, removed at exit (a failed test too)
# with the test's temporary folder $dir. A cluster of this prefix left by a killed run is removed
# first, and said.
cluster_up() {
  # TESSERA_TEST_KEEP=1 keeps the folder (logs, checkpoints) for a look after a failure.
  trap 'cluster down >/dev/null 2>&1; if [ "${TESSERA_TEST_KEEP:-0}" = 1 ]; then echo "kept $dir"; else rm -rf "$dir"; fi' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if [ -n "$(ip netns list | grep -E "^$TESSERA_CLUSTER_PREFIX-" || true)" ]; then
    echo "note: removing a test cluster '$TESSERA_CLUSTER_PREFIX' left by an earlier run"
    cluster down >/dev/null
  fi
  cluster up "$@" || { echo "FAIL cluster.sh up $*"; exit 1; }
}

# Bytes into all hosts through their links (the host-side veth counters): every byte that one
# host sends another crosses the sender's link and the receiver's; counted once, on the way in.
bytes_in() { cluster bytes | awk '{s += $2} END {printf "%.0f\n", s}'; }

# The tessera processes (ranks) running in the cluster's hosts: "host:pid ...".
ranks_running() {
  local ns p
  for ns in $(ip netns list | cut -d' ' -f1 | grep -E "^$TESSERA_CLUSTER_PREFIX-h[0-9]+$"); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$bin" ] && printf '%s:%s ' "${ns#"$TESSERA_CLUSTER_PREFIX"-}" "$p"
    done
  done
  return 0
}

losses() {  # the loss of every step in a metrics file, space-separated, as written
  python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1"
}

# same_losses ONE OTHER STEPS: every step's loss within 1e-5 (relative) of one rank's.
same_losses() {
  python3 - "$(losses "$1")" "$(losses "$2")" "$3" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
n = int(sys.argv[3])
assert len(a) == len(b) == n, (len(a), len(b), n)
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst <= 1e-5, f"losses differ by {worst:.2e} (relative) at worst: one rank {a}, cluster {b}"
print(f"{worst:.1e}")
PY
}

# same_weights ONE.safetensors OTHER.safetensors: every tensor within 1e-4 of one rank's (norm of
# the difference over the norm), as the MPI tests compare them; prints the worst ratio.
same_weights() {
  python3 - "$1" "$2" <<'PY'
import json, math, struct, sys
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: struct.unpack(f"<{(t['data_offsets'][1] - t['data_offsets'][0]) // 4}f",
                             data[t["data_offsets"][0]:t["data_offsets"][1]])
            for k, t in header.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
worst = 0.0
for name in a:
    x, y = a[name], b[name]
    if name.endswith("attn.c_attn.bias"):  # the key bias only sees rounding noise (mpi_train_test)
        c = len(x) // 3
        x, y = x[:c] + x[2 * c:], y[:c] + y[2 * c:]
    diff = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)))
    norm = math.sqrt(sum(p * p for p in x)) or 1.0
    worst = max(worst, diff / norm)
    assert diff <= 1e-4 * norm, f"{name}: |diff| {diff} > 1e-4 x {norm}"
print(f"{worst:.1e}")
PY
}

# tensor_bytes FILE [EXCLUDE]: the bytes of the tensors in a safetensors file (names containing
# EXCLUDE left out).
tensor_bytes() {
  python3 - "$1" "${2:-}" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
ex = sys.argv[2]
print(sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items()
          if k != "__metadata__" and not (ex and ex in k)))
PY
}
