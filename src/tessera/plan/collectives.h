// Time of the collectives a layout runs, from a cluster's links (alpha-beta model). A group of
// `size` ranks has `per_node` of them on each node it spans. Within a node: ring algorithms over
// the intra-node link. Across nodes: hierarchical, as NCCL's and MPI's algorithms behave on these
// machines: reduce-scatter inside each node, the inter-node part on 1 / per_node of the data per
// device (each device on its own network share), all-gather inside the node.
//   ring all-reduce of S bytes over n ranks   2 (n - 1) alpha + 2 (n - 1) / n x S / bandwidth
//   reduce-scatter, all-gather (S: full size)   (n - 1) alpha +     (n - 1) / n x S / bandwidth
//   all-to-all (S: what a rank sends in all)    (n - 1) alpha + the share leaving the node over
//                                               the network, the rest over the node's link
//   point to point                              alpha + S / bandwidth
#pragma once

#include "tessera/plan/cluster.h"
#include "tessera/plan/layout.h"

namespace tessera::plan {

struct Group {
  int size = 1;
  int per_node = 1;
  int nodes() const { return (size + per_node - 1) / per_node; }
};

double all_reduce_seconds(const ClusterSpec& c, const Group& g, double bytes);
double reduce_scatter_seconds(const ClusterSpec& c, const Group& g, double bytes);
double all_gather_seconds(const ClusterSpec& c, const Group& g, double bytes);
double all_to_all_seconds(const ClusterSpec& c, const Group& g, double bytes);
double p2p_seconds(const ClusterSpec& c, bool same_node, double bytes);

// Where a layout's groups fall with Megatron's rank order (tensor-parallel ranks adjacent, then
// context-parallel, then data-parallel, then pipeline; parallel/mesh.h) on nodes of
// c.devices_per_node devices.
Group tp_group(const ClusterSpec& c, const Layout& l);
Group cp_group(const ClusterSpec& c, const Layout& l);  // the cp ranks of a sequence
Group dp_group(const ClusterSpec& c, const Layout& l);
// The parameters' gradient group, dp x cp (Mesh::gradient_group; dp itself at cp = 1).
Group gradient_group(const ClusterSpec& c, const Layout& l);
// HSDP (Layout::zero_shard): the ZeRO shard group, S consecutive gradient-group members (the
// gradient group without HSDP), and the replica group of a shard (its S-apart members; size 1
// without HSDP).
Group zero_shard_group(const ClusterSpec& c, const Layout& l);
Group zero_replica_group(const ClusterSpec& c, const Layout& l);
// Layout::kShardByHost on this cluster: the consecutive gradient-group members one node holds
// (devices_per_node / tp of them; 1 when a tensor-parallel group spans nodes), or 0 (all) when
// the gradient group fits in a node. Any other zero_shard is returned as it is.
int resolve_zero_shard(const ClusterSpec& c, const Layout& l);
Group expert_group(const ClusterSpec& c, const Layout& l);          // ep ranks, runs of dp ranks
Group expert_replica_group(const ClusterSpec& c, const Layout& l);  // dp / ep holders of an expert
// The experts' gradient group: the dp / ep holders of an expert x cp.
Group expert_gradient_group(const ClusterSpec& c, const Layout& l);
// The first and last stages' dp x cp ranks.
Group embedding_group(const ClusterSpec& c, const Layout& l);
bool pipeline_neighbours_share_node(const ClusterSpec& c, const Layout& l);

}  // namespace tessera::plan
