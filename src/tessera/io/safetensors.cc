// Reading and validating safetensors files.
#include "tessera/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>

#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
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

// One mapped safetensors file, validated when it is constructed and immutable afterwards.
struct SafetensorsFile::Shard {
  explicit Shard(std::filesystem::path p);

  std::filesystem::path path;
  MappedFile map;
  const std::byte* data = nullptr;  // start of the data section
  uint64_t data_size = 0;
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;

 private:
  void parse_header(uint64_t header_len);
  [[noreturn]] void invalid(const std::string& msg) const;
};

SafetensorsFile::Shard::Shard(std::filesystem::path p) : path(std::move(p)), map(path) {
  const uint64_t size = map.size();
  TESSERA_CHECK_AS(IoError, size >= 8, path.string(), " is not a valid safetensors file: it is ",
                   size, " bytes long, but the format starts with an 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) {
    header_len |= static_cast<uint64_t>(std::to_integer<uint8_t>(map.data()[i])) << (8 * i);
  }
  TESSERA_CHECK_AS(IoError, header_len <= size - 8, path.string(),
                   " is truncated or not a safetensors file: its header length field says ",
                   header_len, " bytes, but only ", size - 8, " bytes follow it");
  parse_header(header_len);
}

void SafetensorsFile::Shard::invalid(const std::string& msg) const {
  throw IoError(detail::concat("invalid safetensors file ", path.string(), ": ", msg));
}

void SafetensorsFile::Shard::parse_header(uint64_t header_len) {
  const char* h = reinterpret_cast<const char*>(map.data() + 8);
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
  data = map.data() + 8 + header_len;
  data_size = map.size() - 8 - header_len;

  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) invalid("\"__metadata__\" must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) invalid("metadata value \"" + k + "\" must be a string");
        metadata[k] = v.get<std::string>();
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
    if (info.end > data_size) {
      invalid(detail::concat(t, " has data_offsets ", off.dump(), " beyond the end of the data (",
                             data_size, " bytes); the file may be truncated"));
    }
    if (info.end - info.begin != nbytes) {
      invalid(detail::concat(t, " has data_offsets ", off.dump(), " (", info.end - info.begin,
                             " bytes) but its shape ", shape_str(info.shape), " and dtype ",
                             dtype_name(info.dtype), " need ", nbytes, " bytes"));
    }
    tensors.emplace(name, std::move(info));
  }

  // Tensors must tile the data section exactly: no overlaps, no holes, nothing after the end.
  std::vector<std::pair<const std::string*, const TensorInfo*>> order;
  for (const auto& [name, info] : tensors) order.emplace_back(&name, &info);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
  });
  uint64_t pos = 0;
  const std::string* prev = nullptr;
  for (const auto& [name, info] : order) {
    if (info->begin < pos) {
      invalid(detail::concat("tensors '", *prev, "' and '", *name, "' overlap (bytes ",
                             intervals_str(tensors.at(*prev).begin, pos), " and ",
                             intervals_str(info->begin, info->end), ")"));
    }
    if (info->begin > pos) {
      invalid(detail::concat("bytes ", intervals_str(pos, info->begin), " before tensor '", *name,
                             "' belong to no tensor; the data must be packed"));
    }
    if (info->end > pos) prev = name;
    pos = info->end;
  }
  if (pos != data_size) {
    invalid(detail::concat("the data section holds ", data_size,
                           " bytes but the tensors cover only ", pos,
                           "; the header and the data do not match"));
  }
}

SafetensorsFile::SafetensorsFile(std::filesystem::path path) : path_(std::move(path)) {
  auto shard = std::make_shared<const Shard>(path_);
  for (const auto& [name, info] : shard->tensors) tensors_.emplace(name, Entry{&info, shard.get()});
  metadata_ = shard->metadata;
  shards_.push_back(std::move(shard));
}

SafetensorsFile SafetensorsFile::open_model(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  TESSERA_CHECK_AS(IoError, fs::exists(st), "cannot open model weights ", path.string(), ": ",
                   fs::status_known(st) ? "it does not exist" : ec.message());
  if (fs::is_directory(st)) {
    const fs::path single = path / kSafetensorsModelFile;
    const fs::path index = path / kSafetensorsIndexFile;
    if (fs::exists(single, ec)) return SafetensorsFile(single);
    if (fs::exists(index, ec)) return open_index(index);
    throw IoError(detail::concat("the directory ", path.string(),
                                 " holds no model weights: it has neither ", kSafetensorsModelFile,
                                 " nor ", kSafetensorsIndexFile));
  }
  if (path.extension() == ".json") return open_index(path);
  return SafetensorsFile(path);
}

namespace {

// A shard named by an index must be a file in the index's folder: a plain file name.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." &&
         s.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

// The weight_map keys that appear more than once (JSON allows it; nlohmann, like Python's json,
// keeps the last). `text` already parsed once, so this parse cannot fail.
std::vector<std::string> duplicate_weight_map_keys(std::string_view text) {
  std::string top;  // the top-level key being parsed
  std::map<std::string, int> seen;
  std::vector<std::string> dups;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key) {
      if (depth == 1) top = parsed.get<std::string>();
      if (depth == 2 && top == "weight_map" && ++seen[parsed.get<std::string>()] == 2) {
        dups.push_back(parsed.get<std::string>());
      }
    }
    return true;
  };
  [[maybe_unused]] const json again = json::parse(text, cb);
  return dups;
}

}  // namespace

SafetensorsFile SafetensorsFile::open_index(const std::filesystem::path& index) {
  namespace fs = std::filesystem;
  const std::string where = index.string();
  const auto invalid = [&](const std::string& msg) {
    throw IoError(detail::concat("invalid safetensors index ", where, ": ", msg));
  };
  const std::string text = read_file(index);
  json j;
  try {
    j = parse_json(text);
  } catch (const json::exception& e) {
    invalid(detail::concat("it is not valid JSON (", printable(e.what()), ")"));
  }
  if (!j.is_object()) {
    invalid(std::string("it must be a JSON object, but it is a JSON ") + j.type_name());
  }
  if (!j.contains("weight_map")) invalid("it has no \"weight_map\"");
  const json& wm = j.at("weight_map");
  if (!wm.is_object()) {
    invalid(std::string("\"weight_map\" must be an object mapping tensor names to shard file ") +
            "names, but it is a JSON " + wm.type_name());
  }
  if (const auto dups = duplicate_weight_map_keys(text); !dups.empty()) {
    invalid(detail::concat("\"weight_map\" names tensor '", dups.front(),
                           "' more than once, so its shard is ambiguous"));
  }
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors
  for (const auto& [name, v] : wm.items()) {
    if (!v.is_string()) {
      invalid(detail::concat("\"weight_map\" maps tensor '", name, "' to ", printable(v.dump()),
                             "; shard file names must be strings"));
    }
    const std::string shard = v.get<std::string>();
    if (!plain_file_name(shard)) {
      invalid(detail::concat("\"weight_map\" maps tensor '", name, "' to \"", printable(shard),
                             "\", which is not a file name in the index's folder (no '/', '\\', ",
                             "'.' or '..')"));
    }
    by_shard[shard].push_back(name);
  }
  SafetensorsFile out;
  if (j.contains("metadata")) {
    const json& md = j.at("metadata");
    if (!md.is_object()) {
      invalid(std::string("\"metadata\" must be an object, but it is a JSON ") + md.type_name());
    }
    for (const auto& [k, v] : md.items()) {
      out.metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
  }

  const fs::path dir = index.parent_path();
  for (const auto& [shard, names] : by_shard) {
    std::error_code ec;
    TESSERA_CHECK_AS(IoError, fs::exists(dir / shard, ec), where, " names ", shard,
                     ", which does not exist (tensor '", names.front(), "'",
                     names.size() > 1 ? detail::concat(" and ", names.size() - 1, " more") : "",
                     " should be in it)");
  }
  std::map<std::string, const Shard*> shard_of;
  for (const auto& [shard, names] : by_shard) {
    out.shards_.push_back(std::make_shared<const Shard>(dir / shard));
    shard_of[shard] = out.shards_.back().get();
  }
  for (const auto& [shard, names] : by_shard) {
    const Shard* s = shard_of.at(shard);
    for (const std::string& name : names) {
      auto it = s->tensors.find(name);
      if (it == s->tensors.end()) {
        std::string hint;
        for (const auto& [other, o] : shard_of) {
          if (o->tensors.count(name)) hint = " (" + other + " has it)";
        }
        throw IoError(detail::concat(where, " maps tensor '", name, "' to ", shard,
                                     ", which has no tensor of that name", hint));
      }
      out.tensors_.emplace(name, Entry{&it->second, s});
    }
  }
  out.path_ = index;
  out.sharded_ = true;
  return out;
}

std::vector<std::filesystem::path> SafetensorsFile::shard_paths() const {
  std::vector<std::filesystem::path> out;
  for (const auto& s : shards_) out.push_back(s->path);
  std::sort(out.begin(), out.end());
  return out;
}

const std::filesystem::path& SafetensorsFile::file_of(const std::string& name) const {
  return entry(name).shard->path;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  TESSERA_CHECK_AS(IoError, it != tensors_.end(),
                   sharded_ ? "the sharded safetensors model " : "the safetensors file ",
                   path_.string(), " has no tensor named '", name, "'");
  return it->second;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  return *entry(name).info;
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const Entry& e = entry(name);
  return {e.shard->data + e.info->begin, static_cast<size_t>(e.info->end - e.info->begin)};
}

void SafetensorsFile::read_f32(const std::string& name, float* out, int64_t count) const {
  const Entry& e = entry(name);
  TESSERA_CHECK_AS(ShapeError, count == e.info->numel(), "cannot read tensor '", name, "' of ",
                   e.shard->path.string(), ": it has shape ", shape_str(e.info->shape), " (",
                   e.info->numel(), " elements) but the destination holds ", count, " floats");
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
  const Entry& e = entry(name);
  const TensorInfo& ti = *e.info;
  TESSERA_CHECK_AS(IoError, convertible_to_f32(ti.dtype), "cannot read tensor '", name, "' of ",
                   e.shard->path.string(), " as F32: its dtype is ", dtype_name(ti.dtype),
                   ", and only F32, BF16 and F16 convert to F32");
  TESSERA_CHECK_AS(ShapeError, offset >= 0 && count >= 0 && offset <= ti.numel() - count,
                   "elements [", offset, ", ", offset + count, ") are out of range for tensor '",
                   name, "' of ", e.shard->path.string(), ", which has ", ti.numel(), " elements");
  const size_t es = dtype_size(ti.dtype);
  convert_to_f32(ti.dtype, e.shard->data + ti.begin + static_cast<uint64_t>(offset) * es, count,
                 out);
}

Tensor SafetensorsFile::read_raw(const std::string& name, MemCategory cat) const {
  const Entry& e = entry(name);
  const TensorInfo& ti = *e.info;
  Tensor t = Tensor::empty(ti.shape, ti.dtype, cat, name);
  if (ti.end > ti.begin) std::memcpy(t.raw(), e.shard->data + ti.begin, ti.end - ti.begin);
  return t;
}

NamedTensors read_all_f32(const SafetensorsFile& file, MemCategory cat) {
  NamedTensors out;
  for (const std::string& name : file.names()) out.emplace_back(name, file.read_f32(name, cat));
  return out;
}

}  // namespace tessera::io
