#include "tessera/parallel/mesh.h"

#include <string_view>
#include <vector>

#include "tessera/core/error.h"

namespace tessera::parallel {

std::string MeshShape::str() const {
  return detail::concat("dp=", dp, " pp=", pp, " tp=", tp, ep > 1 ? " ep=" : "",
                        ep > 1 ? std::to_string(ep) : "");
}

void validate_mesh(const MeshShape& s, int world_size) {
  TESSERA_CHECK_AS(ConfigError, s.dp > 0 && s.pp > 0 && s.tp > 0,
                   "every mesh size must be positive, got ", s.str());
  TESSERA_CHECK_AS(ConfigError, s.world() == world_size, "the mesh ", s.str(), " needs ", s.world(),
                   " ranks but the world has ", world_size,
                   "; make dp * pp * tp equal the number of ranks");
  TESSERA_CHECK_AS(ConfigError, s.ep > 0 && s.dp % s.ep == 0, config_key("ep"), " ", s.ep,
                   " must divide ", config_key("dp"), " ", s.dp,
                   " (expert-parallel groups are carved from the data-parallel ranks)");
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
  const int tp_rank = r % shape.tp;
  const int dp_rank = (r / shape.tp) % shape.dp;
  const int pp_rank = r / (shape.tp * shape.dp);
  // Ranks sharing the other two coordinates form an axis group, ordered by that axis. Each group
  // is named after its axis and world ranks ('tp[2,3]'), which error messages quote.
  std::vector<int> tp, dp, pp, embedding;
  for (int t = 0; t < shape.tp; ++t) tp.push_back(world_rank(shape, dp_rank, pp_rank, t));
  for (int d = 0; d < shape.dp; ++d) dp.push_back(world_rank(shape, d, pp_rank, tp_rank));
  for (int p = 0; p < shape.pp; ++p) pp.push_back(world_rank(shape, dp_rank, p, tp_rank));
  for (int p : {0, shape.pp - 1})
    for (int d = 0; d < shape.dp; ++d) embedding.push_back(world_rank(shape, d, p, tp_rank));
  tp_ = world.split(pp_rank * shape.dp + dp_rank, tp_rank, group_name("tp", tp));
  dp_ = world.split(pp_rank * shape.tp + tp_rank, dp_rank, group_name("dp", dp));
  pp_ = world.split(dp_rank * shape.tp + tp_rank, pp_rank, group_name("pp", pp));
  // The ranks of the first and the last stage meet in their tp rank's group; every other rank is
  // a group of its own (colors from shape.tp up), which sums nothing.
  const bool end_stage = shape.pp > 1 && (pp_rank == 0 || pp_rank == shape.pp - 1);
  embedding_ = world.split(end_stage ? tp_rank : shape.tp + r, pp_rank * shape.dp + dp_rank,
                           end_stage ? group_name("embedding", embedding)
                                     : group_name("embedding", std::vector<int>{r}));
  std::vector<int> stage, ep, edp;
  for (int d = 0; d < shape.dp; ++d)
    for (int t = 0; t < shape.tp; ++t) stage.push_back(world_rank(shape, d, pp_rank, t));
  for (int d = 0; d < shape.dp; ++d) {
    if (d / shape.ep == dp_rank / shape.ep) ep.push_back(world_rank(shape, d, pp_rank, tp_rank));
    if (d % shape.ep == dp_rank % shape.ep) edp.push_back(world_rank(shape, d, pp_rank, tp_rank));
  }
  stage_ = world.split(pp_rank, r, group_name("stage", stage));
  ep_ = dp_->split(dp_rank / shape.ep, dp_rank % shape.ep, group_name("ep", ep));
  edp_ = dp_->split(dp_rank % shape.ep, dp_rank / shape.ep, group_name("edp", edp));
}

std::vector<comm::Communicator*> Mesh::groups() const {
  return {tp_.get(), dp_.get(), pp_.get(), embedding_.get(), stage_.get(), ep_.get(), edp_.get()};
}

}  // namespace tessera::parallel
