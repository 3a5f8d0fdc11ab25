// Which host each rank runs on, and what the layout makes of it: HSDP's shard group from
// --zero-shard-group (parallel/mesh.h, parallel/zero.h; train_config.h parses the setting) and
// the check that the groups which talk every layer (tp, cp, ep) stay inside a host.
#pragma once

#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/parallel/mesh.h"

namespace tessera::train {

// The host name of every world rank, by world rank: thread ranks share their process's; under
// MPI each process's gethostname() (on the test cluster, its namespace's: h1, h2, ...).
// Collective over `world`.
std::vector<std::string> host_names(comm::Communicator& world);

// Host indices (0, 1, ... in order of first appearance) of host_names.
std::vector<int> host_indices(const std::vector<std::string>& names);

// MeshShape::zero_shard for `setting` ("all", "host" or a number of ranks) on the mesh `shape`:
// 0 when ZeRO shards over the whole gradient group (all, a number equal to the group, or one
// host holding the whole group). "host": the members of this rank's gradient group on its host,
// which must be consecutive in the group and as many on every host. Collective over `world` for
// "host"; throws ConfigError naming the setting when the group does not split that way.
int zero_shard_size(const std::string& setting, const parallel::MeshShape& shape,
                    comm::Communicator& world);
// "host" given every world rank's host index: the same rule, no communication.
int host_shard_size(const parallel::MeshShape& shape, const std::vector<int>& host);

// Sentences (empty: none) naming the tensor-, context- and expert-parallel groups of `shape` whose
// ranks are on more than one host of `hosts` (by world rank), e.g. "2 of 2 tensor-parallel groups
// span hosts (tp[0,2] on h1,h2)": their collectives cross the network in every layer.
std::vector<std::string> placement_problems(const parallel::MeshShape& shape,
                                            const std::vector<std::string>& hosts);

}  // namespace tessera::train
