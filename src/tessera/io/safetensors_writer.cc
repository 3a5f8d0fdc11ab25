// Writing safetensors files, one or Hugging Face's shards with their index.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

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

std::string safetensors_shard_name(int64_t k, int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05lld-of-%05lld.safetensors", static_cast<long long>(k),
                static_cast<long long>(n));
  return buf;
}

namespace {

namespace fs = std::filesystem;

// "model-<digits>-of-<digits>.safetensors": a shard of some save, which a new save may remove.
bool is_shard_name(const std::string& s) {
  const auto digits = [&](size_t& i) {
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - start >= 5;
  };
  const std::string head = "model-", mid = "-of-", tail = ".safetensors";
  size_t i = head.size();
  if (!s.starts_with(head) || !digits(i) || s.compare(i, mid.size(), mid) != 0) return false;
  i += mid.size();
  return digits(i) && s.compare(i, std::string::npos, tail) == 0;
}

// Removes `p` if it exists; true when something was removed. IoError when it cannot be.
bool remove_if_present(const fs::path& p, const std::string& why) {
  std::error_code ec;
  const bool removed = fs::remove(p, ec);
  TESSERA_CHECK_AS(IoError, !ec, "cannot remove ", p.string(), " (", why, "): ", ec.message());
  return removed;
}

}  // namespace

std::vector<SavedFile> save_safetensors_sharded(
    const fs::path& dir, const NamedTensors& tensors, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata) {
  const std::string where = dir.string();
  TESSERA_CHECK_AS(IoError, max_shard_bytes > 0, "cannot write the model to ", where,
                   ": the largest shard size must be positive");
  TESSERA_CHECK_AS(IoError, !metadata.count("total_size"), "cannot write the model to ", where,
                   ": the metadata key \"total_size\" is reserved for the index");
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    TESSERA_CHECK_AS(IoError, !name.empty() && name != "__metadata__", "cannot write the model to ",
                     where, ": \"", name, "\" is not a valid tensor name");
    TESSERA_CHECK_AS(IoError, t.defined(), "cannot write the model to ", where, ": tensor '", name,
                     "' is undefined (it has no storage)");
    TESSERA_CHECK_AS(IoError, names.insert(name).second, "cannot write the model to ", where,
                     ": the tensor name '", name, "' appears more than once");
  }

  // Greedy, in the caller's order: a tensor that would take the shard past the limit starts a
  // new one, so a tensor larger than the limit is alone in its shard.
  std::vector<NamedTensors> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const auto& nt : tensors) {
    const uint64_t n = nt.second.nbytes();
    if (!shards.back().empty() && shard_bytes + n > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(nt);
    shard_bytes += n;
    total += n;
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  TESSERA_CHECK_AS(IoError, !ec, "cannot create the directory ", where, ": ", ec.message());
  const fs::path single = dir / kSafetensorsModelFile;
  const fs::path index = dir / kSafetensorsIndexFile;
  std::vector<SavedFile> out;
  std::set<std::string> keep;  // shard names of this save

  if (shards.size() == 1) {
    // model.safetensors wins over an index (open_model and transformers look for it first), so
    // its rename is the commit; the previous index and shards are removed after it.
    out.push_back({single, save_safetensors(single, tensors, metadata)});
    remove_if_present(index, "the index of a previous save");
  } else {
    const int64_t n = static_cast<int64_t>(shards.size());
    std::vector<std::string> files;
    bool overwrites = false;
    for (int64_t k = 1; k <= n; ++k) {
      files.push_back(safetensors_shard_name(k, n));
      keep.insert(files.back());
      overwrites = overwrites || fs::exists(dir / files.back(), ec) || ec;  // unsure: as if
    }
    // A previous save with as many shards has the same file names: its index must not survive
    // while they are replaced one by one, or a crash would leave it naming a mixture.
    if (overwrites && remove_if_present(index, "the index of a previous save")) {
      fsync_directory(dir);
    }
    nlohmann::json weight_map = nlohmann::json::object();
    for (int64_t k = 0; k < n; ++k) {
      const fs::path p = dir / files[k];
      out.push_back({p, save_safetensors(p, shards[k], metadata)});
      for (const auto& nt : shards[k]) weight_map[nt.first] = files[k];
    }
    nlohmann::json md = nlohmann::json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    md["total_size"] = total;
    const nlohmann::json doc = {{"metadata", md}, {"weight_map", weight_map}};
    out.push_back({index, write_file_atomic(index, doc.dump(2) + "\n")});
    // A previous model.safetensors would still win over the new index; removing it commits.
    remove_if_present(single, "a previous save without shards");
  }
  // Shards of a previous save that this one did not replace. Only names of the exact form
  // model-<5+ digits>-of-<5+ digits>.safetensors are touched (listed first, removed after).
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code dir_ec;
    if (is_shard_name(name) && !keep.count(name) && !it->is_directory(dir_ec)) {
      stale.push_back(it->path());
    }
  }
  TESSERA_CHECK_AS(IoError, !ec, "cannot list the directory ", where, ": ", ec.message());
  for (const fs::path& p : stale) remove_if_present(p, "a shard of a previous save");
  fsync_directory(dir);
  return out;
}

}  // namespace tessera::io
