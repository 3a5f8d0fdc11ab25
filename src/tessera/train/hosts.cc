#include "tessera/train/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>

#include "tessera/core/error.h"
#include "tessera/parallel/gather.h"
#include "tessera/train/train_config.h"

namespace tessera::train {

std::vector<std::string> host_names(comm::Communicator& world) {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) buf[0] = '\0';
  const std::string mine = buf[0] ? buf : "unknown";
  if (world.backend() == "inproc")  // one process: one host
    return std::vector<std::string>(static_cast<size_t>(world.size()), mine);
  return parallel::all_gather_strings(world, mine);
}

std::vector<int> host_indices(const std::vector<std::string>& names) {
  std::map<std::string, int> index;
  std::vector<int> out;
  for (const std::string& n : names)
    out.push_back(index.emplace(n, static_cast<int>(index.size())).first->second);
  return out;
}

namespace {
// "dp" or "dp x cp", as the keys are shown: the ranks that share the gradients.
std::string gradient_group_keys(const parallel::MeshShape& shape) {
  return config_key("dp") + (shape.cp > 1 ? " x " + config_key("cp") : std::string());
}
}  // namespace

int zero_shard_size(const std::string& setting, const parallel::MeshShape& shape,
                    comm::Communicator& world) {
  const int group = shape.dp * shape.cp;
  const int wanted = parse_zero_shard_group(setting);
  if (wanted >= 0) {
    TESSERA_CHECK_AS(ConfigError, wanted == 0 || group % wanted == 0,
                     config_key("zero_shard_group"), " ", wanted, " must divide the ", group,
                     " ranks that share the gradients (", gradient_group_keys(shape), ")");
    return wanted == group ? 0 : wanted;
  }
  return host_shard_size(shape, host_indices(host_names(world)));
}

int host_shard_size(const parallel::MeshShape& shape, const std::vector<int>& host) {
  const int group = shape.dp * shape.cp;
  // Every gradient group (parallel/mesh.h: the dp x cp ranks with the same pipeline and tensor-
  // parallel coordinates, member i at dp i / cp, cp i % cp) must split into runs of S consecutive
  // members, one run per host, with the same S in every group.
  int S = 0;
  bool splits = true;
  for (int pp = 0; pp < shape.pp && splits; ++pp)
    for (int tp = 0; tp < shape.tp && splits; ++tp) {
      std::vector<int> on;  // member i's host
      for (int i = 0; i < group; ++i)
        on.push_back(host[parallel::Mesh::world_rank(shape, i / shape.cp, pp, tp, i % shape.cp)]);
      const int s = static_cast<int>(std::count(on.begin(), on.end(), on[0]));
      splits = group % s == 0 && (S == 0 || s == S);
      for (int i = 0; splits && i < group; ++i)
        for (int j = 0; splits && j < group; ++j) splits = (on[i] == on[j]) == (i / s == j / s);
      S = s;
    }
  TESSERA_CHECK_AS(ConfigError, splits, config_key("zero_shard_group"),
                   " host needs every host to hold the same number of consecutive members of each "
                   "gradient group (the ",
                   gradient_group_keys(shape),
                   " ranks with the same pipeline and tensor-parallel coordinates; mpirun's "
                   "default mapping by slot gives that), and this placement does not: give the "
                   "shard group's size as a number of ranks");
  return S == group ? 0 : S;
}

std::vector<std::string> placement_problems(const parallel::MeshShape& s,
                                            const std::vector<std::string>& hosts) {
  // A world rank's coordinates (parallel/mesh.h: tp fastest, then cp, dp, pp).
  struct Coord {
    int t, c, d, p;
  };
  const int T = s.tp, C = s.cp, D = s.dp;
  auto coord = [&](int r) { return Coord{r % T, r / T % C, r / (T * C) % D, r / (T * C * D)}; };
  std::vector<std::string> out;
  // The groups of one axis are the ranks with the same key (their other coordinates), in order.
  auto check = [&](const char* what, const char* axis, int size,
                   const std::function<int(const Coord&)>& key) {
    if (size <= 1) return;
    std::map<int, std::vector<int>> groups;
    for (int r = 0; r < s.world(); ++r) groups[key(coord(r))].push_back(r);
    int spanning = 0;
    std::string example;
    for (const auto& [k, g] : groups) {
      const bool spans =
          std::any_of(g.begin(), g.end(), [&](int r) { return hosts[r] != hosts[g[0]]; });
      if (!spans || ++spanning > 1) continue;
      std::string ranks, names;
      std::vector<std::string> seen;
      for (int r : g) {
        if (!ranks.empty()) ranks += ',';
        ranks += std::to_string(r);
        if (std::find(seen.begin(), seen.end(), hosts[r]) != seen.end()) continue;
        if (!names.empty()) names += ',';
        names += hosts[r];
        seen.push_back(hosts[r]);
      }
      example = detail::concat(axis, "[", ranks, "] on ", names);
    }
    if (spanning > 0)
      out.push_back(detail::concat(spanning, " of ", groups.size(), " ", what,
                                   " groups span hosts (", example, ")"));
  };
  check("tensor-parallel", "tp", T, [&](const Coord& x) { return (x.p * D + x.d) * C + x.c; });
  check("context-parallel", "cp", C, [&](const Coord& x) { return (x.p * D + x.d) * T + x.t; });
  check("expert-parallel", "ep", s.ep,
        [&](const Coord& x) { return ((x.p * T + x.t) * C + x.c) * D + x.d / s.ep; });
  return out;
}

}  // namespace tessera::train
