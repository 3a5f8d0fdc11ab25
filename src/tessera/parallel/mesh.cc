#include "tessera/parallel/mesh.h"

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
  TESSERA_CHECK_AS(ConfigError, s.ep > 0 && s.dp % s.ep == 0, "--ep ", s.ep, " must divide --dp ",
                   s.dp, " (expert-parallel groups are carved from the data-parallel ranks)");
}

Mesh::Mesh(comm::Communicator& world, const MeshShape& shape) : world_(world), shape_(shape) {
  validate_mesh(shape, world.size());
  const int r = world.rank();
  const int tp_rank = r % shape.tp;
  const int dp_rank = (r / shape.tp) % shape.dp;
  const int pp_rank = r / (shape.tp * shape.dp);
  // Ranks sharing the other two coordinates form an axis group, ordered by that axis.
  tp_ = world.split(pp_rank * shape.dp + dp_rank, tp_rank);
  dp_ = world.split(pp_rank * shape.tp + tp_rank, dp_rank);
  pp_ = world.split(dp_rank * shape.tp + tp_rank, pp_rank);
  const bool end_stage = pp_rank == 0 || pp_rank == shape.pp - 1;
  embedding_ = world.split(shape.pp > 1 && end_stage ? tp_rank : -1, pp_rank * shape.dp + dp_rank);
  stage_ = world.split(pp_rank, r);
  ep_ = dp_->split(dp_rank / shape.ep, dp_rank % shape.ep);
  edp_ = dp_->split(dp_rank % shape.ep, dp_rank / shape.ep);
}

}  // namespace tessera::parallel
