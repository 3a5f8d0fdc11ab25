#include "tessera/parallel/mesh.h"

#include <string_view>
#include <vector>

#include "tessera/core/error.h"

namespace tessera::parallel {

std::string MeshShape::str() const {
  return detail::concat("dp=", dp, " pp=", pp, " tp=", tp, cp > 1 ? " cp=" : "",
                        cp > 1 ? std::to_string(cp) : "", ep > 1 ? " ep=" : "",
                        ep > 1 ? std::to_string(ep) : "");
}

void validate_mesh(const MeshShape& s, int world_size) {
  TESSERA_CHECK_AS(ConfigError, s.dp > 0 && s.pp > 0 && s.tp > 0 && s.cp > 0,
                   "every mesh size must be positive, got ", s.str());
  TESSERA_CHECK_AS(ConfigError, s.world() == world_size, "the mesh ", s.str(), " needs ", s.world(),
                   " ranks but the world has ", world_size,
                   s.cp > 1 ? "; make dp * pp * tp * cp equal the number of ranks"
                            : "; make dp * pp * tp equal the number of ranks");
  TESSERA_CHECK_AS(ConfigError, s.ep > 0 && s.dp % s.ep == 0, config_key("ep"), " ", s.ep,
                   " must divide ", config_key("dp"), " ", s.dp,
                   " (expert-parallel groups are carved from the data-parallel ranks)");
  const int group = s.dp * s.cp;
  TESSERA_CHECK_AS(
      ConfigError, s.zero_shard >= 0 && (s.zero_shard == 0 || group % s.zero_shard == 0),
      "the ZeRO shard group of ", s.zero_shard, " ranks must divide the ", group,
      " ranks that share the gradients (dp", s.cp > 1 ? " x cp" : "", " = ", group, ")");
}

namespace {
std::string group_name(std::string_view axis, const std::vector<int>& ranks) {
  // "dp[0,2]"; an arithmetic run of more than three ranks is shortened: "dp[0,2..14]".
  std::string s(axis);
  s += '[';
  const size_t n = ranks.size();
  bool progression = n > 3;
  for (size_t i = 2; progression && i < n; ++i)
    progression = ranks[i] - ranks[i - 1] == ranks[1] - ranks[0];
  if (progression) {
    s += detail::concat(ranks[0], ",", ranks[1], "..", ranks[n - 1]);
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (i) s += ',';
      s += std::to_string(ranks[i]);
    }
  }
  return s + ']';
}
}  // namespace

Mesh::Mesh(comm::Communicator& world, const MeshShape& shape) : world_(world), shape_(shape) {
  validate_mesh(shape, world.size());
  const int r = world.rank();
  const int T = shape.tp, CP = shape.cp, D = shape.dp;
  const int tp_rank = r % T;
  const int cp_rank = (r / T) % CP;
  const int dp_rank = (r / (T * CP)) % D;
  const int pp_rank = r / (T * CP * D);
  auto at = [&](int d, int p, int t, int c) { return world_rank(shape, d, p, t, c); };
  // Ranks sharing the other coordinates form an axis group, ordered by that axis. Each group is
  // named after its axis and world ranks ('tp[2,3]'), which error messages quote.
  std::vector<int> tp, cp, dp, pp, embedding;
  for (int t = 0; t < T; ++t) tp.push_back(at(dp_rank, pp_rank, t, cp_rank));
  for (int c = 0; c < CP; ++c) cp.push_back(at(dp_rank, pp_rank, tp_rank, c));
  for (int d = 0; d < D; ++d) dp.push_back(at(d, pp_rank, tp_rank, cp_rank));
  for (int p = 0; p < shape.pp; ++p) pp.push_back(at(dp_rank, p, tp_rank, cp_rank));
  for (int p : {0, shape.pp - 1})
    for (int d = 0; d < D; ++d)
      for (int c = 0; c < CP; ++c) embedding.push_back(at(d, p, tp_rank, c));
  tp_ = world.split((pp_rank * D + dp_rank) * CP + cp_rank, tp_rank, group_name("tp", tp));
  cp_ = world.split((pp_rank * D + dp_rank) * T + tp_rank, cp_rank, group_name("cp", cp));
  dp_ = world.split((pp_rank * CP + cp_rank) * T + tp_rank, dp_rank, group_name("dp", dp));
  pp_ = world.split((dp_rank * CP + cp_rank) * T + tp_rank, pp_rank, group_name("pp", pp));
  // The ranks of the first and the last stage meet in their tp rank's group; every other rank is
  // a group of its own (colors from shape.tp up), which sums nothing.
  const bool end_stage = shape.pp > 1 && (pp_rank == 0 || pp_rank == shape.pp - 1);
  embedding_ = world.split(end_stage ? tp_rank : T + r, (pp_rank * D + dp_rank) * CP + cp_rank,
                           end_stage ? group_name("embedding", embedding)
                                     : group_name("embedding", std::vector<int>{r}));
  std::vector<int> stage, ep, edp, dp_cp, edp_cp;
  for (int d = 0; d < D; ++d)
    for (int c = 0; c < CP; ++c) {
      for (int t = 0; t < T; ++t) stage.push_back(at(d, pp_rank, t, c));
      dp_cp.push_back(at(d, pp_rank, tp_rank, c));
      if (d % shape.ep == dp_rank % shape.ep) edp_cp.push_back(at(d, pp_rank, tp_rank, c));
    }
  for (int d = 0; d < D; ++d) {
    if (d / shape.ep == dp_rank / shape.ep) ep.push_back(at(d, pp_rank, tp_rank, cp_rank));
    if (d % shape.ep == dp_rank % shape.ep) edp.push_back(at(d, pp_rank, tp_rank, cp_rank));
  }
  stage_ = world.split(pp_rank, r, group_name("stage", stage));
  ep_ = dp_->split(dp_rank / shape.ep, dp_rank % shape.ep, group_name("ep", ep));
  edp_ = dp_->split(dp_rank % shape.ep, dp_rank / shape.ep, group_name("edp", edp));
  if (CP > 1) {  // the gradient groups: dp (edp) x cp, in world-rank order
    dp_cp_ = world.split(pp_rank * T + tp_rank, dp_rank * CP + cp_rank, group_name("dp_cp", dp_cp));
    edp_cp_ = world.split((pp_rank * shape.ep + dp_rank % shape.ep) * T + tp_rank,
                          (dp_rank / shape.ep) * CP + cp_rank, group_name("edp_cp", edp_cp));
  }
  const int S = shape.shard_size();
  if (S < D * CP) {  // HSDP: shard groups of S consecutive gradient-group members, and replicas
    comm::Communicator& g = gradient_group();
    const int gr = g.rank();
    std::vector<int> shard, replica;
    for (int i = 0; i < D * CP; ++i) {
      const int w = at(i / CP, pp_rank, tp_rank, i % CP);  // gradient-group member i
      if (i / S == gr / S) shard.push_back(w);
      if (i % S == gr % S) replica.push_back(w);
    }
    shard_ = g.split(gr / S, gr % S, group_name("zero_shard", shard));
    replica_ = g.split(gr % S, gr / S, group_name("zero_replica", replica));
  }
}

std::vector<comm::Communicator*> Mesh::groups() const {
  std::vector<comm::Communicator*> g{tp_.get(),    dp_.get(), pp_.get(), embedding_.get(),
                                     stage_.get(), ep_.get(), edp_.get()};
  if (shape_.cp > 1) g.insert(g.end(), {cp_.get(), dp_cp_.get(), edp_cp_.get()});
  if (shard_) g.insert(g.end(), {shard_.get(), replica_.get()});
  return g;
}

}  // namespace tessera::parallel
