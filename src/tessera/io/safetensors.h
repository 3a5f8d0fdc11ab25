// The safetensors format (see docs/FORMATS.md): an 8-byte little-endian header length N, N bytes
// of JSON describing each tensor (dtype, shape, data_offsets) plus optional "__metadata__", then
// the packed tensor bytes. Reading maps the file and validates every header field up front; any
// problem is an IoError that names the file.
//
// Hugging Face's sharded layout is read and written too: a folder with
// "model.safetensors.index.json" ({"metadata": {"total_size": N}, "weight_map": {tensor name:
// shard file name}}) and the shard files "model-00001-of-00003.safetensors", ...
// (SafetensorsFile::open_model, save_safetensors_sharded).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/mapped_file.h"
#include "tessera/core/tensor.h"
#include "tessera/io/checksum.h"

namespace tessera::io {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// "F32" -> DType::F32 etc.; nullopt for names tessera does not support.
std::optional<DType> dtype_from_name(std::string_view name);

// Writes `tensors` (any dtype; names unique, not empty, not "__metadata__") atomically. Tensors
// are stored in name order; the header is padded with spaces so the data starts 8-byte aligned.
// Returns the size and CRC-32 of the bytes written.
FileDigest save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                            const std::map<std::string, std::string>& metadata = {});

// Hugging Face's file names in a model folder.
inline constexpr std::string_view kSafetensorsModelFile = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexFile = "model.safetensors.index.json";
// "model-00002-of-00003.safetensors": shard `k` (1-based) of `n`, at least 5 digits each.
std::string safetensors_shard_name(int64_t k, int64_t n);

struct SavedFile {
  std::filesystem::path path;
  FileDigest digest;
};

// Writes `tensors` into the folder `dir` (created when missing) as Hugging Face's save_pretrained
// does: when their bytes add up to at most `max_shard_bytes` (> 0), one "model.safetensors";
// otherwise shards "model-0000K-of-0000N.safetensors" of at most `max_shard_bytes` tensor bytes
// each (a larger tensor gets a shard of its own), filled greedily in the order of `tensors`, and
// "model.safetensors.index.json" ({"metadata": {"total_size": sum of tensor bytes, ...metadata},
// "weight_map": name -> shard, sorted}). `metadata` goes into every file's "__metadata__" (and
// the index's "metadata"); "total_size" is reserved. Every file is written atomically, in an order
// such that a reader of the folder (open_model, or transformers) sees the previous save, the new
// one, or an error, never a mixture; the files of a previous save that the new one does not
// replace (model.safetensors, the index, model-<digits>-of-<digits>.safetensors) are removed
// (docs/FORMATS.md gives the order). Returns the files written, the index last. Names follow
// save_safetensors' rules; everything is checked before anything is written (IoError).
std::vector<SavedFile> save_safetensors_sharded(
    const std::filesystem::path& dir, const NamedTensors& tensors, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata = {});

struct TensorInfo {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the header)
  uint64_t end = 0;
  int64_t numel() const { return shape_numel(shape); }
};

// Const member functions only read the mappings, so ranks running as threads may share one; a
// copy is cheap (the mappings are shared, not copied) and keeps them alive.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;  // holds no tensors
  // Maps and validates the file; throws IoError naming it and the problem.
  explicit SafetensorsFile(std::filesystem::path path);

  // A model's weights, one file or Hugging Face shards: `path` is
  //  - a directory: its "model.safetensors" when present (transformers' order), else its
  //    "model.safetensors.index.json"; with neither, an IoError naming both;
  //  - a file whose name ends in ".json": a shard index (below);
  //  - any other file: a safetensors file, as the constructor opens it.
  // Through an index, the object holds every tensor the index's "weight_map" names, each read
  // from the shard the index assigns it to (file names in the index's folder); every shard is
  // mapped and validated, every named shard must exist and hold the tensors assigned to it.
  // Tensors a shard holds but the index does not assign to it are not visible: the index is the
  // authority (published checkpoints reuse shards that hold stale or extra tensors). No tensor
  // may be named twice in the index. "total_size" is not checked (Hugging Face's writer counts
  // storage bytes, which can exceed the tensors'). Throws IoError naming the file at fault.
  static SafetensorsFile open_model(const std::filesystem::path& path);

  // The file opened: the safetensors file, or the index of a sharded model.
  const std::filesystem::path& path() const { return path_; }
  bool sharded() const { return sharded_; }
  // The safetensors files mapped, sorted: one, or the index's shards.
  std::vector<std::filesystem::path> shard_paths() const;
  // The file holding tensor `name` (IoError when absent).
  const std::filesystem::path& file_of(const std::string& name) const;

  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // IoError when absent. `begin`/`end` are offsets in the data section of file_of(name).
  const TensorInfo& info(const std::string& name) const;
  DType dtype(const std::string& name) const { return info(name).dtype; }
  const Shape& shape(const std::string& name) const { return info(name).shape; }
  // The file's "__metadata__"; for a sharded model the index's "metadata", where a value that is
  // not a string is given as its JSON text ("total_size": "1234").
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's bytes as stored (little-endian, possibly unaligned).
  std::span<const std::byte> bytes(const std::string& name) const;

  // Converts an F32, BF16 or F16 tensor to float. `count` must equal the tensor's numel.
  void read_f32(const std::string& name, float* out, int64_t count) const;
  Tensor read_f32(const std::string& name, MemCategory cat = MemCategory::Other) const;
  // Elements [offset, offset + count) of the tensor flattened in row-major order; only those
  // bytes are touched, so a ZeRO shard reads its slice without reading the whole file.
  void read_slice_f32(const std::string& name, int64_t offset, int64_t count, float* out) const;
  // A copy in the stored dtype.
  Tensor read_raw(const std::string& name, MemCategory cat = MemCategory::Other) const;

 private:
  struct Shard;  // one mapped, validated safetensors file
  struct Entry {
    const TensorInfo* info = nullptr;  // owned by *shard
    const Shard* shard = nullptr;      // owned by shards_
  };
  static SafetensorsFile open_index(const std::filesystem::path& index);
  const Entry& entry(const std::string& name) const;

  std::filesystem::path path_;
  bool sharded_ = false;
  std::vector<std::shared_ptr<const Shard>> shards_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of `file`, each converted to F32, in name order.
NamedTensors read_all_f32(const SafetensorsFile& file, MemCategory cat = MemCategory::Other);

}  // namespace tessera::io
