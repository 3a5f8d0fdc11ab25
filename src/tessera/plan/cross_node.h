// The bytes a layout moves between nodes per training step, summed over all nodes with each byte
// counted once (what leaves one node for another: the bytes into the hosts that `cluster.sh bytes`
// sums on the test cluster), as tessera's hierarchical backend sends them with one process per
// node (`--ranks-per-process`, comm/mpi/hier_comm.h; docs/ARCHITECTURE.md decision 49), the
// multi-host mode we recommend. One rank per process (flat MPI) moves more: Open MPI's own
// algorithms do not know which peers share a host (2-3x these figures on the test cluster,
// docs/PERFORMANCE.md).
//
// A communicator's members (world ranks, ascending) fall into runs, maximal stretches of
// consecutive members on one node; with m runs over k nodes, for S bytes of the buffer:
//   all-reduce      a chain through the runs: (m - 1) S of partial sums forward, then the result
//                   from the last run to each run on another node: (m - 1) S on distinct nodes;
//   reduce-scatter  the same chain, then each block only to its owner: (m - 1) S + S x (members
//                   not on the last run's node) / size;
//   all-gather      each member's block once to every other node: (k - 1) S;
//   all-to-all      (balanced) each member's block for every member on another node;
//   point to point  S when the two ranks are on different nodes.
// Partial sums travel in fp32 (bf16 reductions too), results in the collective's dtype. TCP/IP
// and MPI headers are not counted (docs/PERFORMANCE.md measures them).
#pragma once

#include <vector>

#include "tessera/plan/cluster.h"
#include "tessera/plan/engine.h"
#include "tessera/plan/layout.h"

namespace tessera::plan {

struct CrossNodeBytes {
  double data_parallel = 0;    // gradient reductions, ZeRO gathers, HSDP's replica all-reduce,
                               // the tied embedding and --sp LayerNorm sums
  double tensor_parallel = 0;  // the tensor-parallel collectives (all-reduces, or under --sp
                               // all-gathers and reduce-scatters)
  double pipeline = 0;         // activations forward and their gradients back between stages
  double expert_parallel = 0;  // the all-to-alls under balanced routing
  // Context parallelism's exchanges between nodes are not modelled: 0 while every cp group is
  // inside a node, and cp_spans_nodes (the total then leaves them out) otherwise.
  double context_parallel = 0;
  bool cp_spans_nodes = false;
  double total() const {
    return data_parallel + tensor_parallel + pipeline + expert_parallel + context_parallel;
  }
};

// One collective over `members` (world ranks, ascending) with `ranks_per_node` consecutive world
// ranks per node. `bytes`: the whole buffer (all-reduce), the full result (reduce-scatter,
// all-gather) or what each member sends in all, its own block included (all-to-all);
// `partial_bytes`: the partial sums of the whole buffer (fp32).
double all_reduce_across(const std::vector<int>& members, int ranks_per_node, double bytes,
                         double partial_bytes);
double reduce_scatter_across(const std::vector<int>& members, int ranks_per_node, double bytes,
                             double partial_bytes);
double all_gather_across(const std::vector<int>& members, int ranks_per_node, double bytes);
double all_to_all_across(const std::vector<int>& members, int ranks_per_node, double bytes);

// The formulas above are linear in the bytes: the coefficients of communicators of one kind,
// summed over them (a collective run on each of them moves what one call here says).
struct AcrossNodes {
  double ar_partial = 0, ar_result = 0, rs_partial = 0, rs_result = 0, ag = 0, a2a = 0;
  void add(const std::vector<int>& members, int ranks_per_node);
  double all_reduce(double bytes, double partial) const {
    return ar_partial * partial + ar_result * bytes;
  }
  double reduce_scatter(double bytes, double partial) const {
    return rs_partial * partial + rs_result * bytes;
  }
  double all_gather(double bytes) const { return ag * bytes; }
  double all_to_all(double bytes) const { return a2a * bytes; }
};

// How a layout's communicators fall on the nodes: per pipeline rank, its ZeRO shard groups, HSDP
// replica groups, expert gradient groups, the stage's dp x cp x tp ranks, the tensor- and
// expert-parallel groups, and how many of its ranks' next pipeline stage is on another node; the
// embedding group; whether a context-parallel group spans nodes. Depends on the degrees, the
// shard group and the ranks per node only.
struct LayoutGroups {
  std::vector<AcrossNodes> shard, replica, expert, stage, tp, ep;
  std::vector<double> next_stage_elsewhere;
  AcrossNodes embedding;
  bool cp_spans_nodes = false;
};
LayoutGroups layout_groups(const Layout& l, int ranks_per_node);

// A step of layout l: `sheets` its model stages (pp x virtual_stages, in model order), m
// micro-batches, `n` the engine's bytes per element, `g` layout_groups(l, ranks per node: the
// cluster's devices_per_node, times the ranks sharing a device when oversubscribed). l.zero_shard
// must be resolved (resolve_zero_shard).
CrossNodeBytes cross_node_bytes(const Layout& l, const LayoutGroups& g,
                                const std::vector<StageSheet>& sheets, int m, const Numerics& n);

}  // namespace tessera::plan
