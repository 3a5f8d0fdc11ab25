#include "tessera/parallel/mesh.h"

#include <gtest/gtest.h>

#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"

namespace tessera::parallel {
namespace {

// Rank order: tp fastest, then dp, then pp. Each axis group holds the ranks that share the other
// two coordinates, and a collective on it sums over exactly those ranks.
TEST(Mesh, AxisGroupsFollowMegatronOrder) {
  const MeshShape shape{2, 2, 2};  // dp, pp, tp
  std::mutex mu;
  std::vector<std::array<int, 6>> seen(8);
  comm::run_inproc(8, [&](comm::Communicator& world) {
    Mesh m(world, shape);
    const int r = world.rank();
    EXPECT_EQ(Mesh::world_rank(shape, m.dp_rank(), m.pp_rank(), m.tp_rank()), r);
    EXPECT_EQ(m.tp_rank(), r % 2);
    EXPECT_EQ(m.dp_rank(), (r / 2) % 2);
    EXPECT_EQ(m.pp_rank(), r / 4);
    // Sum of world ranks over each axis group.
    int sums[3] = {r, r, r};
    m.tp().all_reduce(&sums[0], 1, DType::I32).wait();
    m.dp().all_reduce(&sums[1], 1, DType::I32).wait();
    m.pp().all_reduce(&sums[2], 1, DType::I32).wait();
    std::lock_guard<std::mutex> lock(mu);
    seen[r] = {sums[0], sums[1], sums[2], m.tp().size(), m.dp().size(), m.pp().size()};
  });
  for (int r = 0; r < 8; ++r) {
    const int tp = r % 2, dp = (r / 2) % 2, pp = r / 4;
    EXPECT_EQ(seen[r][0], (r - tp) * 2 + 1) << r;       // r and its tp partner
    EXPECT_EQ(seen[r][1], 2 * (pp * 4 + tp) + 2) << r;  // dp partners differ by 2
    EXPECT_EQ(seen[r][2], 2 * (dp * 2 + tp) + 4) << r;  // pp partners differ by 4
    EXPECT_EQ(seen[r][3], 2);
  }
}

// No parallelism is a group of one, never a missing group: without pipelines (and on the stages
// between the first and the last) the embedding group is the rank alone, and sums nothing.
TEST(Mesh, TheEmbeddingGroupOfARankWithoutTheTiedEmbeddingIsItself) {
  std::mutex mu;
  std::vector<std::pair<int, std::string>> groups(8);
  comm::run_inproc(8, [&](comm::Communicator& world) {
    Mesh m(world, MeshShape{2, 4, 1});  // dp, pp, tp
    std::lock_guard<std::mutex> lock(mu);
    groups[world.rank()] = {m.embedding().size(), m.embedding().name()};
  });
  EXPECT_EQ(groups[0], (std::pair<int, std::string>{4, "embedding[0,1,6,7]"}));  // first stage
  EXPECT_EQ(groups[7], (std::pair<int, std::string>{4, "embedding[0,1,6,7]"}));  // last stage
  EXPECT_EQ(groups[2], (std::pair<int, std::string>{1, "embedding[2]"}));        // stage 1
  EXPECT_EQ(groups[5], (std::pair<int, std::string>{1, "embedding[5]"}));        // stage 2
  comm::run_inproc(2, [&](comm::Communicator& world) {
    Mesh m(world, MeshShape{2, 1, 1});
    EXPECT_EQ(m.embedding().size(), 1);
    EXPECT_EQ(m.stage_group().size(), 2);
  });
}

// Error messages quote communicator names: each group is named after its axis and world ranks.
TEST(Mesh, GroupsAreNamedAfterTheirWorldRanks) {
  std::mutex mu;
  std::vector<std::array<std::string, 4>> names(16);
  comm::run_inproc(16, [&](comm::Communicator& world) {
    Mesh m(world, MeshShape{4, 2, 2});  // dp, pp, tp
    std::lock_guard<std::mutex> lock(mu);
    names[world.rank()] = {m.tp().name(), m.dp().name(), m.pp().name(), m.embedding().name()};
  });
  EXPECT_EQ(names[6][0], "tp[6,7]");
  EXPECT_EQ(names[6][1], "dp[0,2..6]");  // an arithmetic run of more than three is shortened
  EXPECT_EQ(names[6][2], "pp[6,14]");
  EXPECT_EQ(names[6][3], "embedding[0,2..14]");
  EXPECT_EQ(names[13][0], "tp[12,13]");
  EXPECT_EQ(names[13][1], "dp[9,11..15]");
  EXPECT_EQ(names[13][3], "embedding[1,3..15]");
}

// Context parallelism sits between tp and dp (Megatron's order tp, cp, dp, pp): world rank =
// ((pp * dp + d) * cp + c) * tp + t. The cp ranks of a replica hold the same parameters, so the
// gradient groups span dp x cp, the experts' edp x cp; the embedding and stage groups gain them.
TEST(Mesh, ContextParallelRanksSitBetweenTensorAndDataParallel) {
  const MeshShape shape{2, 2, 2, 1, 2};  // dp, pp, tp, ep, cp: 16 ranks
  std::mutex mu;
  std::vector<std::array<std::string, 8>> names(16);
  std::vector<std::array<int, 4>> coords(16);
  comm::run_inproc(16, [&](comm::Communicator& world) {
    Mesh m(world, shape);
    const int r = world.rank();
    EXPECT_EQ(Mesh::world_rank(shape, m.dp_rank(), m.pp_rank(), m.tp_rank(), m.cp_rank()), r);
    std::lock_guard<std::mutex> lock(mu);
    coords[r] = {m.tp_rank(), m.cp_rank(), m.dp_rank(), m.pp_rank()};
    names[r] = {m.tp().name(),
                m.cp().name(),
                m.dp().name(),
                m.pp().name(),
                m.gradient_group().name(),
                m.expert_gradient_group().name(),
                m.embedding().name(),
                m.stage_group().name()};
  });
  EXPECT_EQ(coords[13], (std::array<int, 4>{1, 0, 1, 1}));  // 13 = ((1*2 + 1)*2 + 0)*2 + 1
  EXPECT_EQ(names[13][0], "tp[12,13]");
  EXPECT_EQ(names[13][1], "cp[13,15]");
  EXPECT_EQ(names[13][2], "dp[9,13]");
  EXPECT_EQ(names[13][3], "pp[5,13]");
  EXPECT_EQ(names[13][4], "dp_cp[9,11..15]");
  EXPECT_EQ(names[13][5], "edp_cp[9,11..15]");
  EXPECT_EQ(names[13][6], "embedding[1,3..15]");  // first and last stage, tp rank 1: dp x cp x 2
  EXPECT_EQ(names[13][7], "stage[8,9..15]");
  // Without cp the gradient groups are the dp groups themselves, and the mesh is what it was.
  comm::run_inproc(4, [&](comm::Communicator& world) {
    Mesh m(world, MeshShape{2, 1, 2});
    EXPECT_EQ(&m.gradient_group(), &m.dp());
    EXPECT_EQ(&m.expert_gradient_group(), &m.edp());
    EXPECT_EQ(m.cp().size(), 1);
    EXPECT_EQ(m.groups().size(), 7u);
  });
}

TEST(Mesh, InvalidLayoutsAreErrors) {
  EXPECT_THROW(validate_mesh(MeshShape{2, 2, 2}, 4), ConfigError);
  EXPECT_THROW(validate_mesh(MeshShape{0, 1, 1}, 0), ConfigError);
  EXPECT_THROW(validate_mesh(MeshShape{-1, -1, 1}, 1), ConfigError);
  validate_mesh(MeshShape{3, 1, 2}, 6);
  try {
    validate_mesh(MeshShape{2, 1, 1}, 3);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp=2 pp=1 tp=1 needs 2 ranks but the world has 3"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessera::parallel
