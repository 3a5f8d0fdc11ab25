#!/usr/bin/env bash
# A test cluster on one machine (docs/CLUSTER.md): N hosts as network namespaces, each joined to a
# bridge by a veth pair whose two ends are shaped to a bandwidth (tc tbf), so that every byte
# between two hosts crosses a real TCP link of that speed. Needs root.
#
#   cluster.sh up N [--bandwidth RATE] [--subnet A.B.C.0/24] [--delay D] [--loss P]
#   cluster.sh down                     # removes everything: processes, namespaces, veths, bridge
#   cluster.sh status                   # hosts, addresses, link state, shaping, bytes, processes
#   cluster.sh shape RATE               # changes the bandwidth of a running cluster
#   cluster.sh link HOST up|down        # cuts (or restores) a host's link, from outside
#   cluster.sh kill HOST [SIGNAL]       # kills every process running in a host (default KILL)
#   cluster.sh bytes                    # bytes into and out of each host through its link
#   cluster.sh exec HOST COMMAND...     # runs a command in a host
#   cluster.sh mpirun [MPIRUN OPTIONS] -- PROGRAM [ARGS]  # mpirun with the settings below
#
# Hosts are h1..hN: namespace PREFIX-hI, address A.B.C.I on the bridge PREFIX-br (A.B.C.254 in
# the root namespace, where mpirun runs), host-side veth PREFIX-hI, eth0 inside. The prefix is
# TESSERA_CLUSTER_PREFIX or --prefix P before the command (default tsr); one cluster per prefix.
# RATE is tc's (1gbit, 10gbit, 100mbit) or "none". --delay and --loss need the netem qdisc, which
# many kernels lack (these machines' among them): `up` says whether it is there.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=${TESSERA_CLUSTER_PREFIX:-tsr}
me="cluster.sh"

die() {
  echo "$me: error: $*" >&2
  exit 1
}
say() { echo "$me: $*"; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

need_root() {
  [ "$(id -u)" = 0 ] || die "'$1' needs root (network namespaces, veth pairs and tc); run it as root"
  command -v ip >/dev/null || die "the 'ip' command (iproute2) is not installed"
  command -v tc >/dev/null || die "the 'tc' command (iproute2) is not installed"
}

bridge() { echo "$prefix-br"; }
# The cluster's namespaces, hosts in order (h1, h2, ..., h10).
namespaces() { ip netns list 2>/dev/null | cut -d' ' -f1 | grep -E -- "^$prefix-h[0-9]+$" | sort -V || true; }
# Links in the root namespace that belong to the cluster (its bridge, host-side veths, and the
# peer ends of a failed `up` that never moved into their namespace).
our_links() {
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
    grep -E -- "^$prefix-(br|h[0-9]+p?)$" || true
}
# The cluster's subnet prefix (A.B.C), from the bridge's address.
subnet_base() {
  local a
  a=$(ip -4 -o addr show dev "$(bridge)" 2>/dev/null | awk '{print $4}' | head -1)
  [ -n "$a" ] || die "no test cluster '$prefix' is up (no bridge $(bridge)); run '$me up N' first"
  echo "${a%.*}"
}
# host_ns HOST: the namespace of h2, tsr-h2 or A.B.C.2.
host_ns() {
  local h=$1 ns
  case $h in
    "$prefix"-*) ns=$h ;;
    *.*.*.*) ns="$prefix-h${h##*.}" ;;
    *) ns="$prefix-$h" ;;
  esac
  namespaces | grep -qx -- "$ns" ||
    die "no host '$h' in the test cluster '$prefix' (hosts: $(namespaces | sed "s/^$prefix-//" | tr '\n' ' '))"
  echo "$ns"
}

# tbf needs a bucket of at least one packet plus what the rate fills between two timer ticks;
# 10 ms of traffic (at least 64 KiB, a GSO packet) keeps it exact at 1-10 Gbit/s.
rate_bytes() {  # tc rate (1gbit, 500mbit, 100kbit, 1000000bit) -> bytes per second
  local r=${1,,} n unit
  n=${r%%[a-z]*}
  unit=${r#"$n"}
  [[ $n =~ ^[0-9]+(\.[0-9]+)?$ ]] || return 1
  case $unit in
    bit | "") awk -v n="$n" 'BEGIN{printf "%d", n / 8}' ;;
    kbit) awk -v n="$n" 'BEGIN{printf "%d", n * 1e3 / 8}' ;;
    mbit) awk -v n="$n" 'BEGIN{printf "%d", n * 1e6 / 8}' ;;
    gbit) awk -v n="$n" 'BEGIN{printf "%d", n * 1e9 / 8}' ;;
    *) return 1 ;;
  esac
}

netem_available() {  # tries the qdisc on the bridge (added and removed at once)
  tc qdisc add dev "$(bridge)" root netem delay 0ms 2>/dev/null || return 1
  tc qdisc del dev "$(bridge)" root 2>/dev/null || true
}

# shape_dev RATE DELAY LOSS [ip netns exec NS]: the root qdisc of one end of a link.
shape_dev() {
  local dev=$1 rate=$2 delay=$3 loss=$4
  shift 4
  "$@" tc qdisc del dev "$dev" root 2>/dev/null || true
  local parent=(root)
  if [ -n "$delay$loss" ]; then
    local args=()
    [ -n "$delay" ] && args+=(delay "$delay")
    [ -n "$loss" ] && args+=(loss "$loss")
    "$@" tc qdisc add dev "$dev" root handle 1: netem "${args[@]}"
    parent=(parent 1:1)
  fi
  if [ "$rate" != none ]; then
    local bps burst
    bps=$(rate_bytes "$rate") || die "bad rate '$rate' (tc's syntax: 1gbit, 10gbit, 100mbit; or none)"
    burst=$((bps / 100))
    [ "$burst" -lt 65536 ] && burst=65536
    "$@" tc qdisc add dev "$dev" "${parent[@]}" handle 2: tbf rate "$rate" burst "$burst" latency 100ms
  fi
}

shape_all() {  # RATE DELAY LOSS: both ends of every host's link
  local ns
  for ns in $(namespaces); do
    shape_dev "$ns" "$1" "$2" "$3"
    shape_dev eth0 "$1" "$2" "$3" ip netns exec "$ns"
  done
}

cmd_down() {
  need_root down
  local ns pids l removed=0
  for ns in $(namespaces); do
    # Processes keep a namespace (and its veth) alive after `ip netns del`: end them first.
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086  # a list of pids
      kill -KILL $pids 2>/dev/null || true
    fi
  done
  for ns in $(namespaces); do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.2
    done
    ip netns del "$ns" 2>/dev/null || echo "$me: warning: could not delete namespace $ns" >&2
    removed=$((removed + 1))
  done
  # Deleting a namespace deletes its end of each veth, and with it the pair; what is left is the
  # bridge and the veths of a failed `up`.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    for l in $(our_links); do ip link del "$l" 2>/dev/null || true; done
    [ -z "$(our_links)" ] && break
    sleep 0.2
  done
  if [ -n "$(namespaces)$(our_links)" ]; then
    die "could not remove everything: namespaces '$(namespaces | tr '\n' ' ')', links '$(our_links | tr '\n' ' ')'"
  fi
  if [ "$removed" -gt 0 ]; then say "removed the test cluster '$prefix' ($removed hosts)"; else say "no test cluster '$prefix' was up"; fi
}

cmd_up() {
  need_root up
  local n="" rate=1gbit subnet=10.77.0.0/24 delay="" loss=""
  while [ $# -gt 0 ]; do
    case $1 in
      --bandwidth) rate=${2:?--bandwidth needs a rate}; shift 2 ;;
      --bandwidth=*) rate=${1#*=}; shift ;;
      --subnet) subnet=${2:?--subnet needs A.B.C.0/24}; shift 2 ;;
      --subnet=*) subnet=${1#*=}; shift ;;
      --delay) delay=${2:?--delay needs a time (10ms)}; shift 2 ;;
      --loss) loss=${2:?--loss needs a percentage (1%)}; shift 2 ;;
      -*) die "up: unknown option '$1' (see '$me --help')" ;;
      *) [ -z "$n" ] || die "up: one host count, got '$n' and '$1'"; n=$1; shift ;;
    esac
  done
  if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 250 ]; then
    die "up: N must be a host count from 1 to 250, got '${n}'"
  fi
  [[ $subnet =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/24$ ]] || die "up: --subnet must be A.B.C.0/24, got '$subnet'"
  local base=${BASH_REMATCH[1]}
  [ "$rate" = none ] || rate_bytes "$rate" >/dev/null || die "up: bad rate '$rate' (tc's syntax: 1gbit, 10gbit, 100mbit; or none)"
  [[ $prefix =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "the prefix must be 1-6 lower-case letters and digits, got '$prefix' (interface names are at most 15 characters)"

  # An existing cluster: the same one is kept (shaped again), anything else is refused.
  local have
  have=$(namespaces | wc -l)
  if [ "$have" -gt 0 ] || [ -n "$(our_links)" ]; then
    local want=""
    for i in $(seq 1 "$n"); do want+="$prefix-h$i"$'\n'; done
    if [ "$(namespaces)"$'\n' = "$want" ] && ip link show "$(bridge)" >/dev/null 2>&1 &&
       [ "$(subnet_base)" = "$base" ] && [ "$(our_links | grep -cE -- "-h[0-9]+$")" = "$n" ]; then
      shape_all "$rate" "$delay" "$loss"
      say "the test cluster '$prefix' is already up with $n hosts on $subnet; links shaped to $rate"
      return 0
    fi
    die "a test cluster '$prefix' is already up or left over (namespaces: $(namespaces | tr '\n' ' ')links: $(our_links | tr '\n' ' ')); run '$me down' first, or choose another prefix (TESSERA_CLUSTER_PREFIX)"
  fi
  # The subnet must be free: another interface or route there would take the cluster's traffic.
  local clash
  clash=$(ip -4 -o addr show | awk -v b="$base." 'index($4, b) == 1 {print $2 " " $4}')
  [ -z "$clash" ] || die "up: the subnet $subnet is already in use here ($clash); choose another with --subnet"
  clash=$(ip -4 route show | awk -v b="$base." 'index($1, b) == 1' || true)
  [ -z "$clash" ] || die "up: a route to $subnet exists here ($clash); choose another subnet with --subnet"

  # From here on a failure (or Ctrl-C) removes what was made.
  up_done=0
  trap 'if [ "$up_done" = 0 ]; then echo "$me: error: up failed; removing what it made" >&2; cmd_down >/dev/null 2>&1 || true; fi' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local br
  br=$(bridge)
  ip link add "$br" type bridge
  ip addr add "$base.254/24" dev "$br"
  ip link set "$br" up
  local netem=yes
  netem_available || netem=no
  if [ -n "$delay$loss" ] && [ "$netem" = no ]; then
    die "up: --delay and --loss need the netem qdisc, which this kernel lacks ('tc qdisc add ... netem' fails: $(tc qdisc add dev lo root netem delay 0ms 2>&1 | head -1))"
  fi
  for i in $(seq 1 "$n"); do
    local ns="$prefix-h$i"
    ip netns add "$ns"
    ip link add "$ns" type veth peer name "${ns}p"
    ip link set "${ns}p" netns "$ns"
    ip -n "$ns" link set "${ns}p" name eth0
    ip -n "$ns" addr add "$base.$i/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$ns" master "$br"
    ip link set "$ns" up
    # For the tests of the cleanup: fail part-way, as a real error would.
    if [ -n "${TESSERA_CLUSTER_FAIL_AFTER:-}" ] && [ "$i" -ge "$TESSERA_CLUSTER_FAIL_AFTER" ]; then
      die "up: failing after host $i as TESSERA_CLUSTER_FAIL_AFTER asks"
    fi
  done
  shape_all "$rate" "$delay" "$loss"
  up_done=1
  say "up: $n hosts (h1..h$n = namespaces $prefix-h1..$prefix-h$n, $base.1..$base.$n) on bridge $br ($base.254), links shaped to $rate in each direction"
  if [ "$netem" = yes ]; then
    say "netem is available: --delay and --loss can emulate latency and packet loss"
  else
    say "netem is not available in this kernel: no emulated latency or loss (bandwidth shaping only)"
  fi
}

cmd_status() {
  local nss
  nss=$(namespaces)
  if [ -z "$nss" ] && [ -z "$(our_links)" ]; then
    say "no test cluster '$prefix' is up"
    return 0
  fi
  [ -n "$nss" ] || { say "leftover links of a test cluster '$prefix': $(our_links | tr '\n' ' ')(run '$me down')"; return 1; }
  say "test cluster '$prefix': bridge $(bridge) $(ip -4 -o addr show dev "$(bridge)" 2>/dev/null | awk '{print $4}')"
  local ns
  for ns in $nss; do
    local addr state qd rx tx procs
    addr=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')
    state=$(cat "/sys/class/net/$ns/operstate" 2>/dev/null || echo missing)
    qd=$(tc qdisc show dev "$ns" 2>/dev/null | awk '$2 == "tbf" {for (i = 3; i < NF; ++i) if ($i == "rate") r = "tbf " $(i + 1)} $2 == "netem" {n = "netem"} END {print n (n && r ? " + " : "") r}')
    rx=$(cat "/sys/class/net/$ns/statistics/tx_bytes" 2>/dev/null || echo 0)
    tx=$(cat "/sys/class/net/$ns/statistics/rx_bytes" 2>/dev/null || echo 0)
    procs=$(ip netns pids "$ns" 2>/dev/null | wc -l)
    printf '  %-6s %-16s %-18s link %-5s %-24s in %12s B  out %12s B  %d processes\n' \
      "${ns#"$prefix"-}" "$ns" "$addr" "$state" "${qd:-unshaped}" "$rx" "$tx" "$procs"
  done
}

cmd_bytes() {  # one line per host: name, bytes into the host, bytes out of it (host-side counters)
  local ns
  for ns in $(namespaces); do
    # The host-side end transmits what goes into the namespace.
    echo "${ns#"$prefix"-} $(cat "/sys/class/net/$ns/statistics/tx_bytes") $(cat "/sys/class/net/$ns/statistics/rx_bytes")"
  done
}

cmd_mpirun() {
  local base agent
  base=$(subnet_base)
  agent="$here/cluster_agent.sh"
  local opts=() prog=() seen=0
  for a in "$@"; do
    if [ "$seen" = 0 ] && [ "$a" = -- ]; then seen=1; continue; fi
    if [ "$seen" = 0 ]; then opts+=("$a"); else prog+=("$a"); fi
  done
  [ "$seen" = 1 ] || { prog=("${opts[@]}"); opts=(); }
  local root=()
  [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
  export TESSERA_CLUSTER_PREFIX=$prefix OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # docs/CLUSTER.md says why each of these is needed.
  exec mpirun "${root[@]}" --oversubscribe \
    --mca plm_rsh_agent "$agent" \
    --mca routed direct \
    --mca oob_tcp_if_include "$base.0/24" \
    --mca btl self,tcp \
    --mca btl_tcp_if_include "$base.0/24" \
    --mca rtc_hwloc_vmhole none \
    "${opts[@]}" "${prog[@]}"
}

main() {
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) prefix=${2:?--prefix needs a name}; shift 2 ;;
      --prefix=*) prefix=${1#*=}; shift ;;
      *) break ;;
    esac
  done
  export TESSERA_CLUSTER_PREFIX=$prefix
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    bytes) cmd_bytes ;;
    shape)
      need_root shape
      [ $# -ge 1 ] || die "shape: give a rate (1gbit, 10gbit, none)"
      [ -n "$(namespaces)" ] || die "no test cluster '$prefix' is up"
      shape_all "$1" "${2:-}" "${3:-}"
      say "links shaped to $1"
      ;;
    link)
      need_root link
      if [ $# -ne 2 ] || { [ "$2" != up ] && [ "$2" != down ]; }; then
        die "link: usage: link HOST up|down"
      fi
      local ns
      ns=$(host_ns "$1")
      ip link set "$ns" "$2"
      say "link of $1 ($ns) $2"
      ;;
    kill)
      need_root kill
      [ $# -ge 1 ] || die "kill: usage: kill HOST [SIGNAL]"
      local ns pids
      ns=$(host_ns "$1")
      pids=$(ip netns pids "$ns")
      # shellcheck disable=SC2086  # a list of pids
      [ -z "$pids" ] || kill -"${2:-KILL}" $pids 2>/dev/null || true
      say "sent SIG${2:-KILL} to the $(echo "$pids" | grep -c .) processes of $1 ($ns)"
      ;;
    exec)
      need_root exec
      [ $# -ge 2 ] || die "exec: usage: exec HOST COMMAND..."
      local ns
      ns=$(host_ns "$1")
      shift
      exec ip netns exec "$ns" "$@"
      ;;
    mpirun) cmd_mpirun "$@" ;;
    -h | --help | help | "") usage ;;
    *) die "unknown command '$cmd' (up, down, status, shape, link, kill, bytes, exec, mpirun; see --help)" ;;
  esac
}

main "$@"
