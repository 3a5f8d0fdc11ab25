#include "tessera/io/tensor_set.h"

#include "tessera/core/error.h"

namespace tessera::io {
namespace {

std::string list_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::string s;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kShown) s += detail::concat(" and ", names.size() - kShown, " more");
  return s;
}

// Checks everything and returns, for each expected name, the name in the file.
std::map<std::string, std::string> match(const SafetensorsFile& file,
                                         const std::vector<ExpectedTensor>& expected,
                                         const TensorLoadOptions& opt, TensorLoadReport* report) {
  const std::string where = file.path().string();
  std::map<std::string, std::string> canonical;  // stripped name -> file name
  for (const std::string& fname : file.names()) {
    std::string name = fname;
    for (const std::string& prefix : opt.strip_prefixes) {
      if (name.starts_with(prefix)) {
        name.erase(0, prefix.size());
        break;
      }
    }
    auto [it, inserted] = canonical.emplace(name, fname);
    TESSERA_CHECK_AS(IoError, inserted, "the safetensors file ", where, " holds both '", it->second,
                     "' and '", fname, "', which name the same tensor '", name, "'");
  }

  std::map<std::string, std::string> found;  // expected name -> file name
  std::vector<std::string> missing;
  for (const ExpectedTensor& e : expected) {
    auto it = canonical.find(e.name);
    if (it == canonical.end()) {
      missing.push_back(e.name);
      continue;
    }
    TESSERA_CHECK_AS(IoError, found.emplace(e.name, it->second).second,
                     "the expected tensor set names '", e.name, "' twice");
  }
  TESSERA_CHECK_AS(IoError, missing.empty(), "the safetensors file ", where, " is missing ",
                   missing.size() == 1 ? "the tensor " : "the tensors ", list_names(missing),
                   " that the model needs");
  for (const ExpectedTensor& e : expected) {
    const Shape& got = file.shape(found.at(e.name));
    TESSERA_CHECK_AS(IoError, got == e.shape, "tensor '", found.at(e.name), "' in ", where,
                     " has shape ", shape_str(got), " but the model expects ", shape_str(e.shape));
  }

  TensorLoadReport rep;
  for (const auto& [name, fname] : canonical) {
    if (found.count(name)) continue;
    bool ignored = false;
    for (const std::string& pattern : opt.ignore) ignored = ignored || name_matches(pattern, name);
    (ignored ? rep.ignored : rep.unexpected).push_back(fname);
  }
  TESSERA_CHECK_AS(IoError, rep.unexpected.empty() || !opt.error_on_unexpected,
                   "the safetensors file ", where, " holds ", rep.unexpected.size(),
                   " tensor(s) the model does not have: ", list_names(rep.unexpected),
                   "; is it a checkpoint of a different model?");
  if (report) *report = std::move(rep);
  return found;
}

}  // namespace

bool name_matches(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return name.empty();
  if (pattern[0] != '*') {
    return !name.empty() && name[0] == pattern[0] &&
           name_matches(pattern.substr(1), name.substr(1));
  }
  // '*' consumes at least one non-dot character, then tries every continuation.
  for (size_t i = 1; i <= name.size() && name[i - 1] != '.'; ++i) {
    if (name_matches(pattern.substr(1), name.substr(i))) return true;
  }
  return false;
}

std::map<std::string, Tensor> load_expected(const SafetensorsFile& file,
                                            const std::vector<ExpectedTensor>& expected,
                                            const TensorLoadOptions& options, MemCategory cat,
                                            TensorLoadReport* report) {
  const std::map<std::string, std::string> found = match(file, expected, options, report);
  std::map<std::string, Tensor> out;
  for (const ExpectedTensor& e : expected) {
    Tensor t = Tensor::empty(e.shape, DType::F32, cat, e.name);
    file.read_f32(found.at(e.name), t.f32(), t.numel());
    out.emplace(e.name, std::move(t));
  }
  return out;
}

TensorLoadReport load_into(const SafetensorsFile& file, const NamedTensors& destinations,
                           const TensorLoadOptions& options) {
  std::vector<ExpectedTensor> expected;
  for (const auto& [name, t] : destinations) expected.push_back({name, t.shape()});
  TensorLoadReport report;
  const std::map<std::string, std::string> found = match(file, expected, options, &report);
  for (const auto& [name, t] : destinations) file.read_f32(found.at(name), t.f32(), t.numel());
  return report;
}

void load_slices(const SafetensorsFile& file, const std::vector<SliceRead>& reads,
                 const std::string& missing_hint) {
  std::vector<std::string> stored(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    const SliceRead& r = reads[i];
    const std::string n = file.contains(r.name) ? r.name : "transformer." + r.name;
    TESSERA_CHECK_AS(IoError, file.contains(n), "'", file.path().string(), "' has no tensor '",
                     r.name, "'", missing_hint);
    TESSERA_CHECK_AS(IoError, file.shape(n) == r.shape, "tensor '", n, "' in '",
                     file.path().string(), "' has shape ", shape_str(file.shape(n)),
                     " but the model expects ", shape_str(r.shape));
    stored[i] = n;
  }
  for (size_t i = 0; i < reads.size(); ++i)
    file.read_slice_f32(stored[i], reads[i].offset, reads[i].n, reads[i].dst);
}

}  // namespace tessera::io
