#include "tessera/plan/collectives.h"

#include <algorithm>

namespace tessera::plan {

namespace {

// The part of a reduce-scatter (or all-gather) of `bytes` over g ranks of one node.
double intra_half(const ClusterSpec& c, int g, double bytes) {
  if (g <= 1) return 0;
  return (g - 1) * c.intra_node.latency_seconds() +
         (g - 1.0) / g * bytes / c.intra_node.bytes_per_second();
}

// Across k nodes, over each device's network share.
double inter_half(const ClusterSpec& c, int k, double bytes) {
  if (k <= 1) return 0;
  return (k - 1) * c.inter_node.latency_seconds() +
         (k - 1.0) / k * bytes / c.inter_node.bytes_per_second();
}

}  // namespace

double reduce_scatter_seconds(const ClusterSpec& c, const Group& g, double bytes) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const int per = std::min(g.per_node, g.size);
  return intra_half(c, per, bytes) + inter_half(c, g.nodes(), bytes / per);
}

double all_gather_seconds(const ClusterSpec& c, const Group& g, double bytes) {
  return reduce_scatter_seconds(c, g, bytes);
}

double all_reduce_seconds(const ClusterSpec& c, const Group& g, double bytes) {
  return 2 * reduce_scatter_seconds(c, g, bytes);
}

double all_to_all_seconds(const ClusterSpec& c, const Group& g, double bytes) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double n = g.size, per = std::min(g.per_node, g.size);
  double t = (per - 1) / n * bytes / c.intra_node.bytes_per_second() +
             (n - per) / n * bytes / c.inter_node.bytes_per_second();
  t += (per - 1) * c.intra_node.latency_seconds() + (n - per) * c.inter_node.latency_seconds();
  return t;
}

double p2p_seconds(const ClusterSpec& c, bool same_node, double bytes) {
  const LinkSpec& l = same_node ? c.intra_node : c.inter_node;
  return l.latency_seconds() + bytes / l.bytes_per_second();
}

namespace {
// A group of `size` ranks `stride` apart in rank order.
Group strided(const ClusterSpec& c, int size, int stride) {
  const int D = c.devices_per_node;
  Group g;
  g.size = size;
  g.per_node = stride >= D ? 1 : std::max(1, std::min(size, D / stride));
  return g;
}
// `outer` groups of `inner` ranks `inner_stride` apart, the groups `outer_stride` apart
// (outer_stride
// >= inner x inner_stride): dp x cp. An inner group spanning nodes puts every outer member on
// other nodes; one inside a node takes as many outer members along as fit.
Group nested_group(const ClusterSpec& c, int inner, int inner_stride, int outer, int outer_stride) {
  const Group in = strided(c, inner, inner_stride);
  Group g;
  g.size = inner * outer;
  g.per_node = in.per_node < inner ? in.per_node : inner * strided(c, outer, outer_stride).per_node;
  return g;
}
}  // namespace

Group tp_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.tp, 1);
}
Group cp_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.cp, l.tp);
}
Group dp_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.dp, l.tp * l.cp);
}
Group gradient_group(const ClusterSpec& c, const Layout& l) {
  return nested_group(c, l.cp, l.tp, l.dp, l.tp * l.cp);
}
Group zero_shard_group(const ClusterSpec& c, const Layout& l) {
  const int S = l.shard_ranks();
  if (S >= l.gradient_ranks()) return gradient_group(c, l);
  // Member i of the gradient group is (dp i / cp, cp i % cp): S consecutive members are S cp
  // ranks, or S / cp whole cp groups of consecutive dp ranks.
  if (S <= l.cp) return strided(c, S, l.tp);
  return nested_group(c, l.cp, l.tp, S / l.cp, l.tp * l.cp);
}
Group zero_replica_group(const ClusterSpec& c, const Layout& l) {
  const int S = l.shard_ranks();
  // Members S apart: S x tp ranks apart in rank order (exact when S is a multiple of cp).
  return strided(c, l.shard_replicas(), S * l.tp);
}
int resolve_zero_shard(const ClusterSpec& c, const Layout& l) {
  if (l.zero_shard != Layout::kShardByHost) return l.zero_shard;
  const int per_node = c.devices_per_node >= l.tp ? c.devices_per_node / l.tp : 1;
  return per_node >= l.gradient_ranks() ? 0 : per_node;
}
Group expert_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.ep, l.tp * l.cp);
}
Group expert_replica_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.dp / l.ep, l.tp * l.cp * l.ep);
}
Group expert_gradient_group(const ClusterSpec& c, const Layout& l) {
  return nested_group(c, l.cp, l.tp, l.dp / l.ep, l.tp * l.cp * l.ep);
}
Group embedding_group(const ClusterSpec& c, const Layout& l) {
  Group g = gradient_group(c, l);
  const int replicas = l.dp * l.cp;
  g.size = 2 * replicas;  // the same ranks of the first and the last stage: two nodes or more
  if (l.pp > 1 && l.tp * replicas * l.pp > c.devices_per_node)
    g.per_node = std::min(g.per_node, replicas);
  return g;
}
bool pipeline_neighbours_share_node(const ClusterSpec& c, const Layout& l) {
  const int stage = l.tp * l.cp * l.dp;  // the ranks of one pipeline stage
  return stage * l.pp <= c.devices_per_node || stage < c.devices_per_node;
}

}  // namespace tessera::plan
