// Where ranks run (train/hosts.h): HSDP's shard group by host, and the groups that span hosts.
#include "tessera/train/hosts.h"

#include <gtest/gtest.h>

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"

namespace tessera::train {
namespace {

using parallel::MeshShape;

MeshShape shape(int dp, int tp = 1, int pp = 1, int cp = 1, int ep = 1) {
  MeshShape s;
  s.dp = dp, s.tp = tp, s.pp = pp, s.cp = cp, s.ep = ep;
  return s;
}

TEST(Hosts, IndicesInOrderOfFirstAppearance) {
  EXPECT_EQ(host_indices({"b", "b", "a", "b", "c"}), (std::vector<int>{0, 0, 1, 0, 2}));
}

TEST(Hosts, ShardGroupByHostIsTheGradientGroupMembersOfAHost) {
  EXPECT_EQ(host_shard_size(shape(4), {0, 0, 1, 1}), 2);     // 2 hosts x 2
  EXPECT_EQ(host_shard_size(shape(4), {0, 0, 0, 0}), 0);     // one host: plain ZeRO
  EXPECT_EQ(host_shard_size(shape(2, 2), {0, 0, 1, 1}), 1);  // tp inside a host, dp across
  EXPECT_EQ(host_shard_size(shape(4, 2), {0, 0, 0, 0, 1, 1, 1, 1}), 2);
  EXPECT_EQ(host_shard_size(shape(2, 1, 1, 2), {0, 0, 1, 1}), 2);  // dp x cp: cp pairs per host
  // Dealt round robin (--map-by node): a host's members are not consecutive.
  EXPECT_THROW(host_shard_size(shape(4), {0, 1, 0, 1}), ConfigError);
  // Uneven hosts (3 + 1).
  try {
    host_shard_size(shape(4), {0, 0, 0, 1});
    FAIL() << "uneven hosts accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("same number of consecutive members"), std::string::npos)
        << e.what();
  }
}

TEST(Hosts, ZeroShardSizeOnThreadsIsOneHost) {
  comm::run_inproc(4, [](comm::Communicator& world) {
    EXPECT_EQ(host_names(world).size(), 4u);
    EXPECT_EQ(zero_shard_size("host", shape(4), world), 0);  // every thread on this host
    EXPECT_EQ(zero_shard_size("all", shape(4), world), 0);
    EXPECT_EQ(zero_shard_size("2", shape(4), world), 2);
    EXPECT_EQ(zero_shard_size("4", shape(4), world), 0);
    EXPECT_THROW(zero_shard_size("3", shape(4), world), ConfigError);
  });
}

TEST(Hosts, PlacementNamesTheGroupsThatSpanHosts) {
  const std::vector<std::string> by_slot{"h1", "h1", "h2", "h2"}, by_node{"h1", "h2", "h1", "h2"};
  EXPECT_TRUE(placement_problems(shape(2, 2), by_slot).empty());
  const std::vector<std::string> p = placement_problems(shape(2, 2), by_node);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "2 of 2 tensor-parallel groups span hosts (tp[0,1] on h1,h2)");
  // Experts: dp=4 ep=2 dealt round robin; the data-parallel ranks alone span nothing that talks
  // every layer.
  EXPECT_TRUE(placement_problems(shape(4), by_node).empty());
  const std::vector<std::string> e = placement_problems(shape(4, 1, 1, 1, 2), by_node);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], "2 of 2 expert-parallel groups span hosts (ep[0,1] on h1,h2)");
  // Context parallelism: cp=2 across hosts.
  const std::vector<std::string> c = placement_problems(shape(2, 1, 1, 2), by_node);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0], "2 of 2 context-parallel groups span hosts (cp[0,1] on h1,h2)");
}

}  // namespace
}  // namespace tessera::train
