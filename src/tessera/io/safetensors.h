// The safetensors format (see docs/FORMATS.md): an 8-byte little-endian header length N, N bytes
// of JSON describing each tensor (dtype, shape, data_offsets) plus optional "__metadata__", then
// the packed tensor bytes. Reading maps the file and validates every header field up front; any
// problem is an IoError that names the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
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

struct TensorInfo {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the header)
  uint64_t end = 0;
  int64_t numel() const { return shape_numel(shape); }
};

// Const member functions only read the mapping, so ranks running as threads may share one.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;  // holds no tensors
  // Maps and validates the file; throws IoError naming it and the problem.
  explicit SafetensorsFile(std::filesystem::path path);

  const std::filesystem::path& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // IoError when absent
  DType dtype(const std::string& name) const { return info(name).dtype; }
  const Shape& shape(const std::string& name) const { return info(name).shape; }
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
  void parse_header(uint64_t header_len);
  std::string where() const;  // "<path>"
  [[noreturn]] void invalid(const std::string& msg) const;

  std::filesystem::path path_;
  MappedFile map_;
  const std::byte* data_ = nullptr;  // start of the data section
  uint64_t data_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of `file`, each converted to F32, in name order.
NamedTensors read_all_f32(const SafetensorsFile& file, MemCategory cat = MemCategory::Other);

}  // namespace tessera::io
