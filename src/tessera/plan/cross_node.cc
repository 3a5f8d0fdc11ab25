#include "tessera/plan/cross_node.h"

#include <algorithm>
#include <functional>
#include <map>

namespace tessera::plan {

namespace {

// The nodes of a communicator's runs (maximal stretches of consecutive members on one node).
std::vector<int> run_nodes(const std::vector<int>& members, int ranks_per_node) {
  std::vector<int> nodes;
  for (int w : members) {
    const int node = w / ranks_per_node;
    if (nodes.empty() || nodes.back() != node) nodes.push_back(node);
  }
  return nodes;
}

// A rank's place in the mesh (parallel/mesh.h: world rank = ((pp dp + dp) cp + cp) tp + tp).
struct Coord {
  int pp = 0, dp = 0, cp = 0, tp = 0;
};

Coord coord_of(const Layout& l, int w) {
  Coord c;
  c.tp = w % l.tp;
  c.cp = w / l.tp % l.cp;
  c.dp = w / (l.tp * l.cp) % l.dp;
  c.pp = w / (l.tp * l.cp * l.dp);
  return c;
}

int rank_of(const Layout& l, const Coord& c) {
  return ((c.pp * l.dp + c.dp) * l.cp + c.cp) * l.tp + c.tp;
}

// The world's communicators of one kind among the ranks of pipeline rank `pp` (-1: of all): the
// ranks with the same key, ascending (an empty key: the rank is in none).
using KeyOf = std::function<std::vector<int>(const Coord&)>;
std::vector<std::vector<int>> groups(const Layout& l, int pp, const KeyOf& key) {
  const int stage = l.tp * l.cp * l.dp;
  std::map<std::vector<int>, std::vector<int>> by_key;
  for (int w = pp < 0 ? 0 : pp * stage; w < (pp < 0 ? l.devices() : (pp + 1) * stage); ++w) {
    const std::vector<int> k = key(coord_of(l, w));
    if (!k.empty()) by_key[k].push_back(w);
  }
  std::vector<std::vector<int>> out;
  for (auto& [k, members] : by_key) out.push_back(std::move(members));
  return out;
}

constexpr double kPartial = 4;  // bytes of a partial sum's element (fp32, bf16 reductions too)

}  // namespace

void AcrossNodes::add(const std::vector<int>& members, int ranks_per_node) {
  const std::vector<int> runs = run_nodes(members, ranks_per_node);
  const size_t m = runs.size();
  if (m <= 1) return;
  const double n = static_cast<double>(members.size());
  ar_partial += static_cast<double>(m - 1);
  rs_partial += static_cast<double>(m - 1);
  for (size_t r = 0; r + 1 < m; ++r)
    if (runs[r] != runs.back()) ar_result += 1;  // the result back to the run
  double elsewhere = 0;                          // owners not on the last run's node
  for (int w : members) elsewhere += w / ranks_per_node != runs.back() ? 1 : 0;
  rs_result += elsewhere / n;
  std::map<int, double> per_node;  // members on each node
  for (int w : members) per_node[w / ranks_per_node] += 1;
  ag += static_cast<double>(per_node.size() - 1);
  double pairs = n * n;  // (sender, receiver) on different nodes
  for (const auto& [node, k] : per_node) pairs -= k * k;
  a2a += pairs / n;
}

namespace {
AcrossNodes of(const std::vector<int>& members, int ranks_per_node) {
  AcrossNodes a;
  a.add(members, ranks_per_node);
  return a;
}
}  // namespace

double all_reduce_across(const std::vector<int>& members, int ranks_per_node, double bytes,
                         double partial_bytes) {
  return of(members, ranks_per_node).all_reduce(bytes, partial_bytes);
}
double reduce_scatter_across(const std::vector<int>& members, int ranks_per_node, double bytes,
                             double partial_bytes) {
  return of(members, ranks_per_node).reduce_scatter(bytes, partial_bytes);
}
double all_gather_across(const std::vector<int>& members, int ranks_per_node, double bytes) {
  return of(members, ranks_per_node).all_gather(bytes);
}
double all_to_all_across(const std::vector<int>& members, int ranks_per_node, double bytes) {
  return of(members, ranks_per_node).all_to_all(bytes);
}

LayoutGroups layout_groups(const Layout& l, int ranks_per_node) {
  const int P = l.pp, rpn = std::max(1, ranks_per_node), S = l.shard_ranks();
  LayoutGroups out;
  for (auto* v : {&out.shard, &out.replica, &out.expert, &out.stage, &out.tp, &out.ep})
    v->assign(static_cast<size_t>(P), AcrossNodes{});
  out.next_stage_elsewhere.assign(static_cast<size_t>(P), 0);
  if (l.devices() <= rpn) return out;  // one node
  auto add = [&](AcrossNodes& a, int r, const KeyOf& key) {
    for (const auto& g : groups(l, r, key)) a.add(g, rpn);
  };
  // Member i = dp cp + cp of the gradient group (dp x cp); the shard groups are S consecutive
  // members, the replica groups the members S apart (HSDP).
  auto member = [&](const Coord& c) { return c.dp * l.cp + c.cp; };
  const int stage = l.tp * l.cp * l.dp;
  for (int r = 0; r < P; ++r) {
    const auto u = static_cast<size_t>(r);
    add(out.shard[u], r, [&](const Coord& c) { return std::vector<int>{c.tp, member(c) / S}; });
    add(out.replica[u], r, [&](const Coord& c) { return std::vector<int>{c.tp, member(c) % S}; });
    // The experts' gradient group: the dp / ep holders of an expert x cp.
    add(out.expert[u], r, [&](const Coord& c) { return std::vector<int>{c.tp, c.dp % l.ep}; });
    add(out.stage[u], r, [](const Coord&) { return std::vector<int>{0}; });
    add(out.tp[u], r, [](const Coord& c) { return std::vector<int>{c.dp, c.cp}; });
    // ep consecutive dp ranks of one cp and tp.
    add(out.ep[u], r, [&](const Coord& c) { return std::vector<int>{c.tp, c.cp, c.dp / l.ep}; });
    for (int w = r * stage; w < (r + 1) * stage; ++w) {
      Coord c = coord_of(l, w);
      c.pp = (r + 1) % P;
      if (w / rpn != rank_of(l, c) / rpn) out.next_stage_elsewhere[u] += 1;
    }
  }
  // The embedding group: the first and last stages' dp x cp ranks of a tp rank.
  if (P > 1)
    add(out.embedding, -1, [&](const Coord& c) {
      return c.pp == 0 || c.pp == P - 1 ? std::vector<int>{c.tp} : std::vector<int>{};
    });
  if (l.cp > 1)
    for (const auto& g : groups(l, -1, [](const Coord& c) {
           return std::vector<int>{c.pp, c.dp, c.tp};
         }))
      out.cp_spans_nodes = out.cp_spans_nodes || run_nodes(g, rpn).size() > 1;
  return out;
}

CrossNodeBytes cross_node_bytes(const Layout& l, const LayoutGroups& g,
                                const std::vector<StageSheet>& sheets, int m, const Numerics& n) {
  CrossNodeBytes out;
  const int P = l.pp, V = l.virtual_stages;
  const parallel::ZeroTraits z = parallel::traits(l.zero);
  // The gradient reductions and parameter gathers of `elems` parameter elements per step over one
  // kind of ZeRO group (parallel/zero.h, data_parallel.cc): ZeRO-0 one all-reduce after the last
  // micro-batch; 1 a reduce-scatter then, 2 and 3 one every micro-batch; 1 and 2 then an
  // all-gather of the updated parameters, 3 an all-gather of every bucket before each forward and
  // backward.
  auto zero_step = [&](const AcrossNodes& a, double elems) {
    const double wire = n.comm * elems, partial = kPartial * elems;
    if (!z.sharded()) return a.all_reduce(wire, partial);
    double b = (z.reduces_every_micro_batch ? m : 1) * a.reduce_scatter(wire, partial);
    if (z.shards_parameters)
      b += 2.0 * m * a.all_gather(n.gather * elems);
    else
      b += a.all_gather(n.param * elems);
    return b;
  };
  const double S = l.shard_ranks();
  for (int r = 0; r < P; ++r) {
    const auto u = static_cast<size_t>(r);
    double dense = 0, expert = 0, sequence = 0;
    for (int c = 0; c < V; ++c) {
      const StageSheet& s = sheets[static_cast<size_t>(c * P + r)];
      dense += s.dense_elems;
      expert += s.expert_elems;
      if (l.sp && l.tp > 1) sequence += s.sequence_partial_elems;
    }
    out.data_parallel += zero_step(g.shard[u], dense);
    if (z.sharded() && l.shard_replicas() > 1)  // the reduced shards, in fp32, once per step
      out.data_parallel += g.replica[u].all_reduce(n.grad * dense / S, kPartial * dense / S);
    if (expert > 0) out.data_parallel += zero_step(g.expert[u], expert);
    if (sequence > 0)
      out.data_parallel += g.stage[u].all_reduce(n.grad * sequence, kPartial * sequence);
  }
  const double tied = sheets.front().tied_wte_elems;
  if (P > 1 && tied > 0)
    out.data_parallel += g.embedding.all_reduce(n.grad * tied, kPartial * tied);

  // Per micro-batch, each model stage's collectives on its pipeline rank's groups.
  for (size_t s = 0; s < sheets.size(); ++s) {
    const StageSheet& x = sheets[s];
    const auto r = s % static_cast<size_t>(P);
    const int tp_calls = x.tp_fwd + x.tp_bwd + x.tp_recompute;
    if (l.tp > 1 && tp_calls > 0) {
      // Under --sp each is an all-gather and a reduce-scatter of the whole activation.
      const double partial = x.tp_bytes * kPartial / n.activation;
      const double one =
          l.sp ? g.tp[r].all_gather(x.tp_bytes) + g.tp[r].reduce_scatter(x.tp_bytes, partial)
               : g.tp[r].all_reduce(x.tp_bytes, partial);
      out.tensor_parallel += m * tp_calls * one;
    }
    const int a2a_calls = x.a2a_fwd + x.a2a_bwd;
    if (l.ep > 1 && a2a_calls > 0)
      out.expert_parallel += m * a2a_calls * g.ep[r].all_to_all(x.a2a_bytes);
    if (s + 1 < sheets.size())  // activations to the next stage, their gradients back
      out.pipeline += 2.0 * m * g.next_stage_elsewhere[r] * x.boundary_bytes;
  }
  out.cp_spans_nodes = g.cp_spans_nodes;
  return out;
}

}  // namespace tessera::plan
