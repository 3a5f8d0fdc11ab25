#!/usr/bin/env bash
# Usage: cluster_layouts_test.sh path/to/tessera. Layouts across hosts of the test cluster
# (scripts/cluster.sh: network namespaces on one machine, links shaped to 1 Gbit/s; needs root,
# SKIPPED otherwise): every one trains what one rank trains (each step's loss within 1e-5, the
# final weights within 1e-4 as in mpi_train_test.sh), and its traffic between hosts crosses the
# links (the veth counters grow by at least what the layout must send between the hosts, and by
# less than a hundred times that).
#   2 hosts x 2 ranks: dp=4 ZeRO-1 and ZeRO-3 (the gradients and, for ZeRO-3, the parameters
#   cross); dp=2 x tp=2 --sp with the ranks dealt round robin (--map-by node), so that each
#   tensor-parallel pair spans the hosts; pp=2 x dp=2 (the stages on different hosts); a mixture
#   of experts dp=4 --ep 2, round robin (each expert-parallel pair spans the hosts: all_to_allv
#   crosses).
#   dp=4 ZeRO-3 with --zero-shard-group host (HSDP: sharded inside each host, replicated across
#   the two): trains what one rank trains, and fewer bytes cross the links than under plain
#   ZeRO-3, whose parameter gathers cross them.
#   dp=2 x tp=2 --sp with one process per host of 2 thread ranks (--ranks-per-process 2): also
#   equal, bit for bit, to the same layout as threads.
#   2 hosts x 4 ranks: pp=2 x dp=2 x tp=2 ZeRO-1 (a pipeline stage per host), oversubscribed.
# The round-robin tp run warns that its tensor-parallel groups span the hosts; the by-slot one
# does not.
set -u
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/apps/cluster_lib.sh
. "$here/cluster_lib.sh"
skip_unless_possible
export TESSERA_CLUSTER_PREFIX=tsrt
dir=$(mktemp -d)
cluster_up 2 --bandwidth 1gbit --subnet 10.77.1.0/24
t_start=$SECONDS

for i in $(seq 1 300); do printf 'Line %d of a small corpus for the cluster test.\n%%\n' "$i"; done >"$dir/c.txt"
steps=8
args=(--data "$dir/c.txt" --cache-dir "$dir/cache" --vocab 300 --layers 2 --dim 32 --heads 2
      --seq 16 --batch 12 --micro-batch 3 --steps "$steps" --lr 0.01 --warmup 2 --dropout 0.1
      --eval-every 0 --val-fraction 0 --sample-tokens 0 --threads 1 --comm-timeout 60)
moe=(--moe-experts 4 --moe-top-k 2 --moe-capacity-factor 0.75)
"$bin" train "${args[@]}" --metrics "$dir/one.jsonl" --save "$dir/one" >"$dir/one.log" 2>&1 ||
  { cat "$dir/one.log"; exit 1; }
"$bin" train "${args[@]}" "${moe[@]}" --metrics "$dir/moe1.jsonl" --save "$dir/moe1" >"$dir/moe1.log" 2>&1 ||
  { cat "$dir/moe1.log"; exit 1; }
P=$(tensor_bytes "$dir/one/model.safetensors")                 # parameter bytes
P_dense=$(tensor_bytes "$dir/moe1/model.safetensors" experts)  # the MoE model's, experts left out
act=$((12 * 16 * 32 * 4))  # one step's activations at a cut between layers: batch x seq x dim, fp32
echo "parameters: $P bytes (the MoE model without its experts: $P_dense); activations at a cut: $act bytes per step"

# run NAME HOSTS MIN_BYTES REFERENCE [mpirun options] -- train options: trains on the cluster,
# compares with REFERENCE (one, moe1), checks the bytes into the hosts during the run (kept in
# crossed_of[NAME]; its log is log_of[NAME], its folder dir_of[NAME]).
declare -A crossed_of log_of dir_of
run() {
  local name=$1 hosts=$2 min=$3 ref=$4
  shift 4
  local mopts=()
  while [ "$1" != -- ]; do mopts+=("$1"); shift; done
  shift
  local tag=${name//[^a-z0-9]/_} before after t0=$SECONDS
  before=$(bytes_in)
  if ! timeout 240 bash "$cluster_sh" mpirun --host "$hosts" "${mopts[@]}" -- "$bin" train \
      "${args[@]}" "$@" --metrics "$dir/$tag.jsonl" --save "$dir/$tag" >"$dir/$tag.log" 2>&1; then
    fail "$name: mpirun failed" "$dir/$tag.log"
    return
  fi
  after=$(bytes_in)
  local crossed=$((after - before)) took=$((SECONDS - t0)) d w
  crossed_of[$name]=$crossed
  log_of[$name]=$dir/$tag.log
  dir_of[$name]=$dir/$tag
  grep -Eq "(mpi|hier) backend" "$dir/$tag.log" || fail "$name: did not use an MPI backend" "$dir/$tag.log"
  if d=$(same_losses "$dir/$ref.jsonl" "$dir/$tag.jsonl" $steps 2>&1); then
    ok "$name: every step's loss equals one rank's (worst $d relative)"
  else
    fail "$name: losses: $d"
  fi
  if w=$(same_weights "$dir/$ref/model.safetensors" "$dir/$tag/model.safetensors" 2>&1); then
    ok "$name: final weights equal one rank's (worst $w)"
  else
    fail "$name: weights: $w"
  fi
  if [ "$crossed" -ge "$min" ] && [ "$crossed" -le $((100 * min)) ]; then
    ok "$name: $crossed bytes crossed the links between hosts ($(awk -v a="$crossed" -v b="$min" 'BEGIN{printf "%.1f", a / b}')x the least it must send, $min), ${took} s"
  else
    fail "$name: $crossed bytes crossed the links between hosts; expected from $min to $((100 * min))"
  fi
}

# The least each layout must move between the hosts in $steps steps (bytes into both hosts):
# dp across hosts reduces every gradient, each host receiving at least the other host's half for
# its shards (P/2) and, after the update, the other half of the parameters (P/2): 2P per step
# over both hosts (ZeRO-3 gathers parameters on top); a pipeline cut between hosts sends the
# activations forward and their gradients back; tensor parallelism across hosts (--sp) gathers
# and reduce-scatters each layer's activations (4 per layer and step, half of each crossing);
# the mixture's dense part is reduced over dp as above.
run "dp=4 ZeRO-1 (2 hosts x 2)" h1:2,h2:2 $((2 * P * steps)) one -- --dp 4 --zero 1
run "dp=4 ZeRO-3 (2 hosts x 2)" h1:2,h2:2 $((2 * P * steps)) one -- --dp 4 --zero 3
# HSDP: each rank's shard (P/2) all-reduced with its replica on the other host, 2P a step in all.
run "dp=4 ZeRO-3 HSDP by host (2 hosts x 2)" h1:2,h2:2 $((2 * P * steps)) one -- --dp 4 --zero 3 \
  --zero-shard-group host
hsdp_log=${log_of["dp=4 ZeRO-3 HSDP by host (2 hosts x 2)"]:-none}
if grep -q "ZeRO 3 shards over 2 ranks, replicated 2 times" "$hsdp_log"; then
  ok "HSDP by host: shard groups of 2 ranks (one host each), replicated over the 2 hosts"
else
  fail "HSDP by host: the run did not shard by host" "$hsdp_log"
fi
z3=${crossed_of["dp=4 ZeRO-3 (2 hosts x 2)"]:-0}
hs=${crossed_of["dp=4 ZeRO-3 HSDP by host (2 hosts x 2)"]:-0}
if [ "$hs" -gt 0 ] && [ "$hs" -lt "$z3" ]; then
  ok "HSDP by host sent $hs bytes between the hosts, plain ZeRO-3 $z3 ($(awk -v a="$hs" -v b="$z3" 'BEGIN{printf "%.2f", a / b}')x)"
else
  fail "HSDP by host sent $hs bytes between the hosts, not fewer than plain ZeRO-3's $z3"
fi
run "dp=2 x tp=2 --sp, tp across hosts" h1:2,h2:2 $((4 * act * steps)) one --map-by node -- \
  --dp 2 --tp 2 --sp --zero 1
run "pp=2 x dp=2, a stage per host" h1:2,h2:2 $((2 * act * steps)) one -- --pp 2 --dp 2 --zero 1
run "MoE dp=4 ep=2, ep across hosts" h1:2,h2:2 $((2 * P_dense * steps)) moe1 --map-by node -- \
  "${moe[@]}" --dp 4 --ep 2 --zero 1
# Several ranks per process: one process per host with 2 thread ranks (the hierarchical backend)
# trains, bit for bit, what the same layout trains as threads of one process.
run "dp=2 x tp=2 --sp, 2 ranks per process (one process per host)" h1:1,h2:1 $((2 * P * steps)) \
  one -- --dp 2 --tp 2 --sp --zero 1 --ranks-per-process 2
"$bin" train "${args[@]}" --dp 2 --tp 2 --sp --zero 1 --save "$dir/threads_dp2_tp2" \
  >"$dir/threads_dp2_tp2.log" 2>&1 || fail "dp=2 x tp=2 --sp as threads failed" "$dir/threads_dp2_tp2.log"
if cmp -s "$dir/threads_dp2_tp2/model.safetensors" \
    "${dir_of["dp=2 x tp=2 --sp, 2 ranks per process (one process per host)"]:-none}/model.safetensors"; then
  ok "2 ranks per process across the hosts: the weights of the threads' run, bit for bit"
else
  fail "2 ranks per process across the hosts: the weights differ from the threads' run"
fi
run "pp=2 x dp=2 x tp=2 ZeRO-1 (2 hosts x 4)" h1:4,h2:4 $((2 * act * steps)) one -- \
  --pp 2 --dp 2 --tp 2 --zero 1

# Placement: a run whose tensor-parallel pairs span the hosts says so; one mapped by slot does not.
tp_log=${log_of["dp=2 x tp=2 --sp, tp across hosts"]:-none}
if grep -q "placement: 2 of 2 tensor-parallel groups span hosts (tp\[0,1\] on h1,h2)" "$tp_log"; then
  ok "tp across hosts: the run names the tensor-parallel groups that span the hosts"
else
  fail "tp across hosts: no placement warning" "$tp_log"
fi
by_slot_log=${log_of["pp=2 x dp=2 x tp=2 ZeRO-1 (2 hosts x 4)"]:-none}
if [ -f "$by_slot_log" ] && ! grep -q "placement:" "$by_slot_log"; then
  ok "pp x dp x tp by slot: no placement warning (tp inside each host)"
else
  fail "pp x dp x tp by slot: a placement warning, or no log" "$by_slot_log"
fi

echo "cluster layouts: $((checks - failures)) passed, $failures failed, $((SECONDS - t_start)) s on the cluster"
[ $failures -eq 0 ]
