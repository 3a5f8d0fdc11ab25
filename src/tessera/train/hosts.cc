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
  if (world.backend() != "mpi")
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

int zero_shard_size(const std::string& setting, const parallel::MeshShape& shape,
                    comm::Communicator& world) {
  const int group = shape.dp * shape.cp;
  const int wanted = parse_zero_shard_group(setting);
  const std::string grad_group =
      config_key("dp") + (shape.cp > 1 ? " x " + config_key("cp") : std::string());
  if (wanted >= 0) {
    TESSERA_CHECK_AS(ConfigError, wanted == 0 || group % wanted == 0,
                     config_key("zero_shard_group"), " ", wanted, " must divide the ", group,
                     " ranks that share the gradients (", grad_group, ")");
    return wanted == group ? 0 : wanted;
  }
  return host_shard_size(shape, host_indices(host_names(world)));
}

int host_shard_size(const parallel::MeshShape& shape, const std::vector<int>& host) {
  const int group = shape.dp * shape.cp;
  const std::string grad_group =
      config_key("dp") + (shape.cp > 1 ? " x " + config_key("cp") : std::string());
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
                   grad_group,
                   " ranks with the same pipeline and tensor-parallel coordinates; mpirun's "
                   "default mapping by slot gives that), and this placement does not: give the "
                   "shard group's size as a number of ranks");
  return S == group ? 0 : S;
}

std::vector<std::string> placement_problems(const parallel::MeshShape& s,
                                            const std::vector<std::string>& hosts) {
  std::vector<std::string> out;
  // The groups of one axis: f(first member's other coordinates) lists a group's world ranks.
  auto check = [&](const char* what, const char* axis, int size,
                   const std::function<std::vector<std::vector<int>>()>& groups) {
    if (size <= 1) return;
    int spanning = 0, total = 0;
    std::string example;
    for (const std::vector<int>& g : groups()) {
      ++total;
      bool spans = false;
      for (int r : g) spans = spans || hosts[r] != hosts[g[0]];
      if (!spans) continue;
      if (++spanning > 1) continue;
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
      out.push_back(
          detail::concat(spanning, " of ", total, " ", what, " groups span hosts (", example, ")"));
  };
  const int D = s.dp, P = s.pp, T = s.tp, C = s.cp, E = s.ep;
  auto at = [&](int d, int p, int t, int c) { return parallel::Mesh::world_rank(s, d, p, t, c); };
  check("tensor-parallel", "tp", T, [&] {
    std::vector<std::vector<int>> gs;
    for (int p = 0; p < P; ++p)
      for (int d = 0; d < D; ++d)
        for (int c = 0; c < C; ++c) {
          gs.emplace_back();
          for (int t = 0; t < T; ++t) gs.back().push_back(at(d, p, t, c));
        }
    return gs;
  });
  check("context-parallel", "cp", C, [&] {
    std::vector<std::vector<int>> gs;
    for (int p = 0; p < P; ++p)
      for (int d = 0; d < D; ++d)
        for (int t = 0; t < T; ++t) {
          gs.emplace_back();
          for (int c = 0; c < C; ++c) gs.back().push_back(at(d, p, t, c));
        }
    return gs;
  });
  check("expert-parallel", "ep", E, [&] {
    std::vector<std::vector<int>> gs;
    for (int p = 0; p < P; ++p)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c)
          for (int first = 0; first < D; first += E) {
            gs.emplace_back();
            for (int d = first; d < first + E; ++d) gs.back().push_back(at(d, p, t, c));
          }
    return gs;
  });
  return out;
}

}  // namespace tessera::train
