#!/usr/bin/env bash
# Usage: cluster_script_test.sh path/to/tessera [path/to/test_comm_mpi]. scripts/cluster.sh itself (needs root, SKIPPED
# otherwise): up makes the hosts (namespaces, addresses, veths on a bridge, tbf on both ends of
# each link) and is idempotent; a leftover cluster, a subnet in use, a bad count or rate, and a
# user who is not root are refused with an error that says so; the launch agent gives each host
# its name and refuses an unknown one; the links carry what the shaping allows (a TCP transfer
# between two hosts at 100 Mbit/s); link down/up; down removes everything, also after an `up`
# that failed part-way, and says so when there is nothing to remove.
set -u
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/apps/cluster_lib.sh
. "$here/cluster_lib.sh"
skip_unless_possible
export TESSERA_CLUSTER_PREFIX=tsrs
dir=$(mktemp -d)
net=10.77.3
t_start=$SECONDS
# expect NAME STATUS PATTERN -- command...: the command's status and a line matching PATTERN (ERE).
expect() {
  local name=$1 want=$2 pattern=$3 out status
  shift 4
  out=$("$@" 2>&1)
  status=$?
  if [ "$status" = "$want" ] && grep -qE -- "$pattern" <<<"$out"; then
    ok "$name"
  else
    fail "$name: status $status (wanted $want), output:"$'\n'"$out"
  fi
}
leftovers() {
  { ip netns list | cut -d' ' -f1; ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1; } |
    grep -E "^$TESSERA_CLUSTER_PREFIX-" | tr '\n' ' '
}

expect "not root: refused" 1 "error: 'up' needs root" -- \
  setpriv --reuid 65534 --regid 65534 --clear-groups bash "$cluster_sh" up 2 --subnet $net.0/24
expect "a bad host count: refused" 1 "N must be a host count from 1 to 250, got '0'" -- \
  cluster up 0 --subnet $net.0/24
expect "a bad rate: refused" 1 "bad rate 'fast'" -- cluster up 2 --bandwidth fast --subnet $net.0/24
expect "a bad subnet: refused" 1 "--subnet must be A.B.C.0/24" -- cluster up 2 --subnet 10.77.3.0/16

cluster_up 2 --bandwidth 1gbit --subnet $net.0/24 >"$dir/up.log" 2>&1
if grep -qE "^cluster.sh: netem is (not )?available" "$dir/up.log"; then
  ok "up says whether netem is available: $(grep -oE 'netem is (not )?available' "$dir/up.log")"
else
  fail "up does not say whether netem is available" "$dir/up.log"
fi
ns_ok=1
for i in 1 2; do
  ip -n "tsrs-h$i" -4 -o addr show dev eth0 | grep -q "$net.$i/24" || ns_ok=0
  grep -q INTERFACE=tsrs-br "/sys/class/net/tsrs-h$i/master/uevent" 2>/dev/null || ns_ok=0
  tc qdisc show dev "tsrs-h$i" | grep -q "tbf .*rate 1Gbit" || ns_ok=0
  ip netns exec "tsrs-h$i" tc qdisc show dev eth0 | grep -q "tbf .*rate 1Gbit" || ns_ok=0
done
if [ $ns_ok = 1 ]; then
  ok "up 2: two namespaces, $net.1-2 on a bridge, tbf at 1 Gbit/s on both ends of each link"
else
  fail "up 2: hosts not as expected: $(cluster status)"
fi
expect "up again with the same settings: kept" 0 "already up with 2 hosts" -- \
  cluster up 2 --subnet $net.0/24
expect "up with another host count: refused as a leftover" 1 "already up or left over .*run 'cluster.sh down' first" -- \
  cluster up 3 --subnet $net.0/24
expect "another cluster on the same subnet: refused" 1 "subnet $net.0/24 is already in use here" -- \
  env TESSERA_CLUSTER_PREFIX=tsrz bash "$cluster_sh" up 2 --subnet $net.0/24
expect "status lists the hosts" 0 "h2 +tsrs-h2 +$net.2/24 +link up +tbf 1Gbit" -- cluster status
expect "the agent gives each host its name" 0 "^h1 h2$" -- \
  bash -c "bash '$cluster_sh' mpirun --host h1:1,h2:1 -- hostname | sort | tr '\n' ' ' | sed 's/ $//'"
# Processes in the hosts share this machine's cores: the MPI backend counts them by the kernel's boot
# id, not by host name (a wait then yields its core at once when they outnumber the cores).
if [ -n "${2:-}" ]; then
  expect "the ranks of both hosts count as one machine's" 0 "PASSED.* 1 test" -- \
    bash "$cluster_sh" mpirun --host h1:1,h2:1 -- "$2" --gtest_color=no --gtest_filter=Mpi.CountsEveryProcessOnThisMachine
fi
expect "the agent refuses an unknown host" 255 "no host 'h9' \(network namespace tsrs-h9\)" -- \
  bash "$(dirname "$cluster_sh")/cluster_agent.sh" -x h9 true

# The shaping holds: 12.5 MB from h1 to h2 at 100 Mbit/s takes about a second.
cluster shape 100mbit >/dev/null
cat >"$dir/recv.py" <<'PY'
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5999)); s.listen(1); c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.time()
    n += len(b)
print(f"{n * 8 / (time.time() - t0) / 1e6:.0f}")
PY
ip netns exec tsrs-h2 timeout 30 python3 "$dir/recv.py" >"$dir/rate" &
recv=$!
sleep 0.5
ip netns exec tsrs-h1 timeout 30 python3 -c "
import socket; s = socket.create_connection(('$net.2', 5999)); s.sendall(bytes(12_500_000)); s.close()"
wait $recv
mbit=$(cat "$dir/rate")
if [ -n "$mbit" ] && [ "$mbit" -ge 60 ] && [ "$mbit" -le 110 ]; then
  ok "shaped to 100mbit, a TCP transfer from h1 to h2 runs at $mbit Mbit/s"
else
  fail "shaped to 100mbit, a TCP transfer from h1 to h2 ran at '${mbit}' Mbit/s"
fi
cluster shape 1gbit >/dev/null

expect "link down" 0 "link of h2 \(tsrs-h2\) down" -- cluster link h2 down
state=$(cat /sys/class/net/tsrs-h2/operstate)
if [ "$state" = down ]; then ok "link down: the veth is down"; else fail "link down: the veth is $state"; fi
expect "link up" 0 "link of h2 \(tsrs-h2\) up" -- cluster link h2 up
expect "down" 0 "removed the test cluster 'tsrs' \(2 hosts\)" -- cluster down
if [ -z "$(leftovers)" ]; then ok "down: nothing left"; else fail "down left: $(leftovers)"; fi
expect "down again: nothing to do" 0 "no test cluster 'tsrs' was up" -- cluster down
expect "status with no cluster" 0 "no test cluster 'tsrs' is up" -- cluster status

# An up that fails part-way removes what it made; down after it still works.
expect "a failed up says so" 1 "up failed; removing what it made" -- \
  env TESSERA_CLUSTER_FAIL_AFTER=2 bash "$cluster_sh" up 3 --subnet $net.0/24
if [ -z "$(leftovers)" ]; then ok "a failed up: nothing left"; else fail "a failed up left: $(leftovers)"; fi
expect "down after a failed up" 0 "no test cluster 'tsrs' was up" -- cluster down

echo "cluster.sh: $((checks - failures)) passed, $failures failed, $((SECONDS - t_start)) s"
[ $failures -eq 0 ]
