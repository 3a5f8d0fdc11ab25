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
}  // namespace

Group tp_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.tp, 1);
}
Group dp_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.dp, l.tp);
}
Group expert_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.ep, l.tp);
}
Group expert_replica_group(const ClusterSpec& c, const Layout& l) {
  return strided(c, l.dp / l.ep, l.tp * l.ep);
}
Group embedding_group(const ClusterSpec& c, const Layout& l) {
  Group g = dp_group(c, l);
  g.size = 2 * l.dp;  // the same dp ranks of the first and the last stage: two nodes or more
  if (l.pp > 1 && l.tp * l.dp * l.pp > c.devices_per_node) g.per_node = std::min(g.per_node, l.dp);
  return g;
}
bool pipeline_neighbours_share_node(const ClusterSpec& c, const Layout& l) {
  return l.tp * l.dp * l.pp <= c.devices_per_node || l.tp * l.dp < c.devices_per_node;
}

}  // namespace tessera::plan
