// Writing safetensors files.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/safetensors.h"

namespace tessera::io {

FileDigest save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<const std::pair<std::string, Tensor>*> order;
  order.reserve(tensors.size());
  for (const auto& nt : tensors) {
    TESSERA_CHECK_AS(IoError, !nt.first.empty() && nt.first != "__metadata__", "cannot write ",
                     path.string(), ": \"", nt.first, "\" is not a valid tensor name");
    TESSERA_CHECK_AS(IoError, nt.second.defined(), "cannot write ", path.string(), ": tensor '",
                     nt.first, "' is undefined (it has no storage)");
    order.push_back(&nt);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
  for (size_t i = 1; i < order.size(); ++i) {
    TESSERA_CHECK_AS(IoError, order[i - 1]->first != order[i]->first, "cannot write ",
                     path.string(), ": the tensor name '", order[i]->first,
                     "' appears more than once");
  }

  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto* nt : order) {
    const Tensor& t = nt->second;
    header[nt->first] = {{"dtype", std::string(dtype_name(t.dtype()))},
                         {"shape", t.shape()},
                         {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts at a multiple of 8

  unsigned char len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));

  AtomicFileWriter w(path);
  w.write(len, 8);
  w.write(text);
  for (const auto* nt : order) {
    if (nt->second.nbytes() > 0) w.write(nt->second.raw(), nt->second.nbytes());
  }
  return w.commit();
}

}  // namespace tessera::io
