// Reading and validating safetensors files.
#include "tessera/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>

#include "tessera/core/error.h"
#include "tessera/io/half.h"
#include "tessera/io/json_parse.h"

namespace tessera::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts would need byte swaps");

namespace {

using nlohmann::json;

bool convertible_to_f32(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

void convert_to_f32(DType t, const std::byte* src, int64_t count, float* out) {
  switch (t) {
    case DType::F32:
      if (count > 0) std::memcpy(out, src, static_cast<size_t>(count) * 4);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < count; ++i) {
        bf16 b;
        std::memcpy(&b.bits, src + 2 * i, 2);
        out[i] = from_bf16(b);
      }
      return;
    case DType::F16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    default:
      return;  // callers check convertible_to_f32 first
  }
}

// Parser messages quote the offending bytes, which may be binary; keep the message readable.
std::string printable(std::string s) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return s;
}

std::string intervals_str(uint64_t a, uint64_t b) {
  return detail::concat("[", a, ", ", b, ")");
}

}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t :
       {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U16, DType::U8}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

SafetensorsFile::SafetensorsFile(std::filesystem::path path) : path_(std::move(path)), map_(path_) {
  const uint64_t size = map_.size();
  TESSERA_CHECK_AS(IoError, size >= 8, where(), " is not a valid safetensors file: it is ", size,
                   " bytes long, but the format starts with an 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) {
    header_len |= static_cast<uint64_t>(std::to_integer<uint8_t>(map_.data()[i])) << (8 * i);
  }
  TESSERA_CHECK_AS(IoError, header_len <= size - 8, where(),
                   " is truncated or not a safetensors file: its header length field says ",
                   header_len, " bytes, but only ", size - 8, " bytes follow it");
  parse_header(header_len);
}

std::string SafetensorsFile::where() const {
  return path_.string();
}

void SafetensorsFile::invalid(const std::string& msg) const {
  throw IoError(detail::concat("invalid safetensors file ", where(), ": ", msg));
}

void SafetensorsFile::parse_header(uint64_t header_len) {
  const char* h = reinterpret_cast<const char*>(map_.data() + 8);
  json j;
  try {
    j = parse_json(std::string_view(h, header_len));
  } catch (const json::exception& e) {
    invalid(detail::concat("the ", header_len, "-byte header is not valid JSON (",
                           printable(e.what()), ")"));
  }
  if (!j.is_object()) {
    invalid(std::string("the header must be a JSON object, but it is a JSON ") + j.type_name());
  }
  data_ = map_.data() + 8 + header_len;
  data_size_ = map_.size() - 8 - header_len;

  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) invalid("\"__metadata__\" must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) invalid("metadata value \"" + k + "\" must be a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string t = "tensor '" + name + "'";
    if (!entry.is_object()) invalid(t + " must be described by an object");
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(field)) invalid(t + " has no \"" + field + "\" field");
    }
    TensorInfo info;
    const json& dt = entry["dtype"];
    if (!dt.is_string()) invalid(t + " has a \"dtype\" that is not a string");
    const auto parsed = dtype_from_name(dt.get<std::string>());
    if (!parsed) {
      invalid(t + " has unsupported dtype \"" + dt.get<std::string>() +
              "\" (supported: F32, BF16, F16, I32, I64, U16, U8)");
    }
    info.dtype = *parsed;

    const json& shape = entry["shape"];
    if (!shape.is_array()) invalid(t + " has a \"shape\" that is not an array");
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : shape) {
      if (!d.is_number_unsigned()) {
        invalid(t + " has shape " + shape.dump() + "; dimensions must be non-negative integers");
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX)) overflow = true;
      overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    overflow = overflow || __builtin_mul_overflow(numel, dtype_size(info.dtype), &nbytes);
    if (overflow) invalid(t + " has shape " + shape.dump() + ", whose size overflows 64 bits");

    const json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      invalid(t + " has data_offsets " + off.dump() +
              "; expected [begin, end], non-negative integers");
    }
    info.begin = off[0].get<uint64_t>();
    info.end = off[1].get<uint64_t>();
    if (info.begin > info.end) invalid(t + " has data_offsets " + off.dump() + " with begin > end");
    if (info.end > data_size_) {
      invalid(detail::concat(t, " has data_offsets ", off.dump(), " beyond the end of the data (",
                             data_size_, " bytes); the file may be truncated"));
    }
    if (info.end - info.begin != nbytes) {
      invalid(detail::concat(t, " has data_offsets ", off.dump(), " (", info.end - info.begin,
                             " bytes) but its shape ", shape_str(info.shape), " and dtype ",
                             dtype_name(info.dtype), " need ", nbytes, " bytes"));
    }
    tensors_.emplace(name, std::move(info));
  }

  // Tensors must tile the data section exactly: no overlaps, no holes, nothing after the end.
  std::vector<std::pair<const std::string*, const TensorInfo*>> order;
  for (const auto& [name, info] : tensors_) order.emplace_back(&name, &info);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
  });
  uint64_t pos = 0;
  const std::string* prev = nullptr;
  for (const auto& [name, info] : order) {
    if (info->begin < pos) {
      invalid(detail::concat("tensors '", *prev, "' and '", *name, "' overlap (bytes ",
                             intervals_str(tensors_.at(*prev).begin, pos), " and ",
                             intervals_str(info->begin, info->end), ")"));
    }
    if (info->begin > pos) {
      invalid(detail::concat("bytes ", intervals_str(pos, info->begin), " before tensor '", *name,
                             "' belong to no tensor; the data must be packed"));
    }
    if (info->end > pos) prev = name;
    pos = info->end;
  }
  if (pos != data_size_) {
    invalid(detail::concat("the data section holds ", data_size_,
                           " bytes but the tensors cover only ", pos,
                           "; the header and the data do not match"));
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  TESSERA_CHECK_AS(IoError, it != tensors_.end(), "the safetensors file ", where(),
                   " has no tensor named '", name, "'");
  return it->second;
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const TensorInfo& ti = info(name);
  return {data_ + ti.begin, static_cast<size_t>(ti.end - ti.begin)};
}

void SafetensorsFile::read_f32(const std::string& name, float* out, int64_t count) const {
  const TensorInfo& ti = info(name);
  TESSERA_CHECK_AS(ShapeError, count == ti.numel(), "cannot read tensor '", name, "' of ", where(),
                   ": it has shape ", shape_str(ti.shape), " (", ti.numel(),
                   " elements) but the destination holds ", count, " floats");
  read_slice_f32(name, 0, count, out);
}

Tensor SafetensorsFile::read_f32(const std::string& name, MemCategory cat) const {
  const TensorInfo& ti = info(name);
  Tensor t = Tensor::empty(ti.shape, DType::F32, cat, name);
  read_slice_f32(name, 0, ti.numel(), t.data<float>());
  return t;
}

void SafetensorsFile::read_slice_f32(const std::string& name, int64_t offset, int64_t count,
                                     float* out) const {
  const TensorInfo& ti = info(name);
  TESSERA_CHECK_AS(IoError, convertible_to_f32(ti.dtype), "cannot read tensor '", name, "' of ",
                   where(), " as F32: its dtype is ", dtype_name(ti.dtype),
                   ", and only F32, BF16 and F16 convert to F32");
  TESSERA_CHECK_AS(ShapeError, offset >= 0 && count >= 0 && offset <= ti.numel() - count,
                   "elements [", offset, ", ", offset + count, ") are out of range for tensor '",
                   name, "' of ", where(), ", which has ", ti.numel(), " elements");
  const size_t es = dtype_size(ti.dtype);
  convert_to_f32(ti.dtype, data_ + ti.begin + static_cast<uint64_t>(offset) * es, count, out);
}

Tensor SafetensorsFile::read_raw(const std::string& name, MemCategory cat) const {
  const TensorInfo& ti = info(name);
  Tensor t = Tensor::empty(ti.shape, ti.dtype, cat, name);
  if (ti.end > ti.begin) std::memcpy(t.raw(), data_ + ti.begin, ti.end - ti.begin);
  return t;
}

NamedTensors read_all_f32(const SafetensorsFile& file, MemCategory cat) {
  NamedTensors out;
  for (const std::string& name : file.names()) out.emplace_back(name, file.read_f32(name, cat));
  return out;
}

}  // namespace tessera::io
