#include "tessera/parallel/gather.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "tessera/core/error.h"

namespace tessera::parallel {

std::vector<std::string> all_gather_strings(comm::Communicator& c, const std::string& s) {
  const int n = c.size();
  int64_t len = static_cast<int64_t>(s.size());
  std::vector<int64_t> lens(n);
  c.all_gather(&len, lens.data(), 1, DType::I64).wait();
  const int64_t max_len = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::vector<char> mine(max_len, 0), all(static_cast<size_t>(max_len) * n);
  std::memcpy(mine.data(), s.data(), s.size());
  c.all_gather(mine.data(), all.data(), max_len, DType::U8).wait();
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) out[r].assign(all.data() + r * max_len, lens[r]);
  return out;
}

double all_reduce_sum(comm::Communicator& c, double x) {
  c.all_reduce(&x, 1, DType::F64).wait();
  return x;
}

io::NamedTensors gather_named_tensors(comm::Communicator& c, io::NamedTensors local) {
  nlohmann::json meta = nlohmann::json::array();
  for (const auto& [name, t] : local) {
    TESSERA_ASSERT(t.dtype() == DType::F32, "gather_named_tensors: ", name, " is not F32");
    meta.push_back({name, t.shape()});
  }
  const std::vector<std::string> all = all_gather_strings(c, meta.dump());
  if (c.rank() != 0) {
    for (const auto& [name, t] : local)
      c.send(t.f32(), static_cast<size_t>(t.numel()), DType::F32, 0).wait();
    return {};
  }
  std::set<std::string> seen;
  for (const auto& [name, t] : local) seen.insert(name);
  for (int r = 1; r < c.size(); ++r)
    for (const auto& e : nlohmann::json::parse(all[static_cast<size_t>(r)])) {
      Tensor t = Tensor::zeros(e[1].get<Shape>(), DType::F32, MemCategory::Buffers,
                               "checkpoint.pipeline_gather");
      c.recv(t.f32(), static_cast<size_t>(t.numel()), DType::F32, r).wait();
      const std::string name = e[0].get<std::string>();
      if (seen.insert(name).second) local.emplace_back(name, std::move(t));
    }
  return local;
}

}  // namespace tessera::parallel
