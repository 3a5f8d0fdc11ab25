// The device mesh: world ranks arranged as a dp x pp x cp x tp grid, with a sub-communicator per
// axis. Rank order (as Megatron-LM): tp fastest, then cp, then dp, then pp, so a tensor-parallel
// group is a run of neighbouring ranks (one machine), the context-parallel ranks of a sequence are
// next, and
//   world rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank.
// Context parallelism (cp, docs/ARCHITECTURE.md decision 42) splits every sequence over cp ranks
// that hold the same parameters and see different tokens: for the gradients, ZeRO's shards and the
// optimizer they are more data-parallel replicas, so the parameters' engines run over the dp x cp
// group (gradient_group(); Megatron's "dp_cp"), the experts' over edp x cp, while the data sampler
// still reads dp_rank (the replica: the cp ranks of a replica fetch the same sequences). With
// cp = 1 every group is what it was without it.
// Expert parallelism carves the data-parallel group: ep consecutive data-parallel ranks form an
// expert-parallel group (they split a mixture-of-experts layer's experts), and the ranks with the
// same position in their expert-parallel group form the expert-data-parallel group (dp / ep
// ranks holding the same experts):
//   dp_rank = edp_rank * ep + ep_rank.
// Hybrid sharding (HSDP): with zero_shard = S (0 < S < dp x cp), the gradient group splits into
// shard groups of S consecutive members (a host, when ranks are placed by host) and replica
// groups (the members at the same position of every shard group): ZeRO shards over the shard
// group and the replicas all-reduce their shards.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::parallel {

struct MeshShape {
  int dp = 1;
  int pp = 1;
  int tp = 1;
  int ep = 1;  // divides dp; not a factor of the world
  int cp = 1;  // context-parallel ranks per sequence
  // HSDP: the members of the gradient group (dp x cp) that share ZeRO shards; 0 = all of them.
  int zero_shard = 0;
  int world() const { return dp * pp * tp * cp; }
  // The ranks that share ZeRO shards: zero_shard, or the whole gradient group.
  int shard_size() const { return zero_shard > 0 ? zero_shard : dp * cp; }
  std::string str() const;  // "dp=2 pp=1 tp=2" (" cp=2" when cp > 1, " ep=2" when ep > 1)
};

// Throws ConfigError when a size is not positive, the product differs from world_size, ep
// does not divide dp, or zero_shard does not divide dp x cp.
void validate_mesh(const MeshShape& s, int world_size);

class Mesh {
 public:
  // Collective over `world`: splits it into the three axis groups. `world` must outlive the Mesh.
  Mesh(comm::Communicator& world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  comm::Communicator& world() const { return world_; }
  comm::Communicator& dp() const { return *dp_; }
  comm::Communicator& pp() const { return *pp_; }
  comm::Communicator& tp() const { return *tp_; }
  // The cp ranks that hold one sequence between them (the same dp, pp and tp coordinates).
  comm::Communicator& cp() const { return *cp_; }
  // The ranks that sum the parameters' gradients and share their ZeRO shards: dp x cp with this
  // rank's pp and tp coordinates, ordered by world rank (the dp group itself when cp = 1).
  comm::Communicator& gradient_group() const { return dp_cp_ ? *dp_cp_ : *dp_; }
  // The expert-parallel group and the expert-data-parallel group (see above), and the experts'
  // gradient group: edp x cp (edp itself when cp = 1).
  comm::Communicator& ep() const { return *ep_; }
  comm::Communicator& edp() const { return *edp_; }
  comm::Communicator& expert_gradient_group() const { return edp_cp_ ? *edp_cp_ : *edp_; }
  // HSDP (zero_shard): the parameters' ZeRO shard group, S consecutive members of the gradient
  // group (the gradient group itself without HSDP), and the replica group that all-reduces each
  // shard (the members at this rank's position of every shard group; null without HSDP). The
  // experts keep sharding over their whole gradient group.
  comm::Communicator& zero_shard_group() const { return shard_ ? *shard_ : gradient_group(); }
  comm::Communicator* zero_replica_group() const { return replica_.get(); }
  // Megatron's embedding group: the dp x cp ranks of the first and the last pipeline stage with
  // this rank's tp rank (they sum the tied wte's gradients). This rank alone (a group of one) on
  // the other stages and without pipeline parallelism.
  comm::Communicator& embedding() const { return *embedding_; }
  // The dp x cp x tp ranks of this rank's pipeline stage (they hold the same units; the world
  // without pipeline parallelism), ordered by world rank.
  comm::Communicator& stage_group() const { return *stage_; }
  // Every group of the mesh but the world, once each (traffic counters).
  std::vector<comm::Communicator*> groups() const;
  int rank() const { return world_.rank(); }
  int dp_rank() const { return dp_->rank(); }
  int pp_rank() const { return pp_->rank(); }
  int tp_rank() const { return tp_->rank(); }
  int cp_rank() const { return cp_->rank(); }
  int ep_rank() const { return ep_->rank(); }

  // The world rank at grid coordinates (dp_rank, pp_rank, tp_rank, cp_rank).
  static int world_rank(const MeshShape& s, int dp_rank, int pp_rank, int tp_rank,
                        int cp_rank = 0) {
    return ((pp_rank * s.dp + dp_rank) * s.cp + cp_rank) * s.tp + tp_rank;
  }

 private:
  comm::Communicator& world_;
  MeshShape shape_;
  std::unique_ptr<comm::Communicator> dp_, pp_, tp_, cp_, embedding_, stage_, ep_, edp_;
  // With cp > 1 only (else the dp and edp groups serve).
  std::unique_ptr<comm::Communicator> dp_cp_, edp_cp_;
  // With HSDP only.
  std::unique_ptr<comm::Communicator> shard_, replica_;
};

}  // namespace tessera::parallel
