#include "tessera/io/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <system_error>

#include "tessera/core/error.h"
#include "tessera/core/mapped_file.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/checksum.h"
#include "tessera/io/json_parse.h"

namespace tessera::io {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "tessera-checkpoint";
constexpr int kFormatVersion = 1;
constexpr const char* kTmpSuffix = ".tmp";
constexpr const char* kOldSuffix = ".old";

// "step-<digits>" -> the step; nullopt for anything else.
std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  const std::string prefix = "step-";
  if (!name.starts_with(prefix) || name.size() == prefix.size() || name.size() > prefix.size() + 18)
    return std::nullopt;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// The entries of `dir`; none when it does not exist or cannot be read.
std::vector<fs::path> entries_of(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) out.push_back(it->path());
  return out;
}

bool is_complete(const fs::path& step_dir) {
  std::error_code ec;
  return fs::is_regular_file(step_dir / kStateFile, ec);
}

[[noreturn]] void fs_error(const std::string& what, const fs::path& p, const std::error_code& ec) {
  throw IoError(detail::concat(what, " ", p.string(), " failed: ", ec.message()));
}

json file_entry(const FileDigest& d) {
  return {{"bytes", d.bytes}, {"crc32", crc32_hex(d.crc32)}};
}

// "step-<digits>.tmp" (a save in progress) or "step-<digits>.old" (a removal in progress).
bool is_stale_step_dir(const std::string& name) {
  for (const char* suffix : {kTmpSuffix, kOldSuffix}) {
    const size_t n = std::string_view(suffix).size();
    if (name.ends_with(suffix) && parse_step_dir_name(name.substr(0, name.size() - n))) return true;
  }
  return false;
}

// Removes a step directory without ever leaving a half-deleted directory under a step name: it
// is first renamed to "<name>.old", which no loader considers.
void remove_step_dir(const fs::path& step_dir, std::error_code& ec) {
  fs::path old = step_dir;
  old += kOldSuffix;
  fs::remove_all(old, ec);
  if (!ec) fs::rename(step_dir, old, ec);
  if (!ec) fs::remove_all(old, ec);
}

// Removes leftovers of crashed saves and checkpoints beyond the newest `keep`. Best effort: a
// checkpoint that was saved stays saved even if an old one cannot be removed.
void prune(const fs::path& dir, int keep, const fs::path& current) {
  std::error_code ec;
  for (const fs::path& p : entries_of(dir)) {
    const std::string name = p.filename().string();
    if (is_stale_step_dir(name) || name.starts_with(std::string(kLatestFile) + ".tmp.")) {
      fs::remove_all(p, ec);
    }
  }
  auto all = list_checkpoints(dir);
  const size_t n_remove = all.size() > static_cast<size_t>(keep) ? all.size() - keep : 0;
  for (size_t i = 0; i < n_remove; ++i) {
    if (all[i].second != current) remove_step_dir(all[i].second, ec);
  }
}

const json& field(const json& j, const char* key, const fs::path& file) {
  TESSERA_CHECK_AS(IoError, j.is_object() && j.contains(key), "the checkpoint state file ",
                   file.string(), " has no \"", key,
                   "\" field: the checkpoint is corrupt; use an earlier checkpoint");
  return j[key];
}

void verify_file(const fs::path& dir, const std::string& name, const json& entry,
                 const fs::path& state_path, bool verify_checksums) {
  const fs::path p = dir / name;
  const json& bytes = field(entry, "bytes", state_path);
  const json& crc = field(entry, "crc32", state_path);
  uint32_t want_crc = 0;
  TESSERA_CHECK_AS(IoError,
                   bytes.is_number_unsigned() && crc.is_string() &&
                       parse_crc32_hex(crc.get<std::string>(), &want_crc),
                   "the checkpoint state file ", state_path.string(), " has an invalid entry for ",
                   name, ": ", entry.dump());
  std::error_code ec;
  const bool exists = fs::is_regular_file(p, ec);
  TESSERA_CHECK_AS(IoError, exists, "the checkpoint file ", p.string(),
                   " is missing: the checkpoint is incomplete; use an earlier checkpoint");
  const uint64_t size = fs::file_size(p, ec);
  if (ec) fs_error("getting the size of", p, ec);
  TESSERA_CHECK_AS(IoError, size == bytes.get<uint64_t>(), "size mismatch in ", p.string(), ": ",
                   state_path.filename().string(), " records ", bytes.get<uint64_t>(),
                   " bytes but the file has ", size,
                   ": the file is truncated or corrupt; use an earlier checkpoint");
  if (!verify_checksums) return;
  const MappedFile map(p);
  const uint32_t got = crc32_update(0, map.data(), map.size());
  TESSERA_CHECK_AS(IoError, got == want_crc, "checksum mismatch in ", p.string(),
                   ": the file is corrupt; use an earlier checkpoint (CRC-32 ", crc32_hex(got),
                   ", expected ", crc32_hex(want_crc), ")");
}

}  // namespace

std::string_view library_version() {
  return TESSERA_VERSION_STRING;
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

namespace {

// save_checkpoint without the message context.
fs::path save_checkpoint_steps(const fs::path& dir, const Checkpoint& ckpt,
                               const CheckpointOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fs_error("creating the checkpoint directory", dir, ec);

  const std::string name = step_dir_name(ckpt.step);
  const fs::path final_dir = dir / name;
  const fs::path staging = dir / (name + kTmpSuffix);
  fs::remove_all(staging, ec);  // a crashed save of the same step
  if (ec) fs_error("removing the stale directory", staging, ec);
  fs::create_directory(staging, ec);
  if (ec) fs_error("creating", staging, ec);

  try {
    const std::map<std::string, std::string> meta = {{"format", "pt"}};
    json files = json::object();
    auto written = [&](const char* file) {
      if (options.after_file) options.after_file(file);
    };
    files[kModelFile] = file_entry(save_safetensors(staging / kModelFile, ckpt.model, meta));
    written(kModelFile);
    files[kOptimizerFile] =
        file_entry(save_safetensors(staging / kOptimizerFile, ckpt.optimizer, meta));
    written(kOptimizerFile);
    files[kConfigFile] = file_entry(
        write_file_atomic(staging / kConfigFile, hf_config_to_json(ckpt.config).dump(2) + "\n"));
    written(kConfigFile);
    const json state = {{"format", kFormat},
                        {"format_version", kFormatVersion},
                        {"tessera_version", library_version()},
                        {"step", ckpt.step},
                        {"state", ckpt.state},
                        {"files", files}};
    write_file_atomic(staging / kStateFile, state.dump(2) + "\n");  // last: marks it complete
  } catch (...) {
    fs::remove_all(staging, ec);  // a failed save leaves nothing behind
    throw;
  }

  if (fs::exists(final_dir, ec)) {
    // Re-saving a step (e.g. after resuming): rename cannot replace a non-empty directory, so
    // the old copy goes first. A crash in between falls back to the newest complete checkpoint.
    remove_step_dir(final_dir, ec);
    if (ec) fs_error("removing the previous copy of", final_dir, ec);
  }
  fs::rename(staging, final_dir, ec);
  if (ec) fs_error("renaming " + staging.string() + " to", final_dir, ec);
  fsync_directory(dir);
  write_file_atomic(dir / kLatestFile, name + "\n");
  prune(dir, options.keep_last, final_dir);
  return final_dir;
}

}  // namespace

fs::path save_checkpoint(const fs::path& dir, const Checkpoint& ckpt,
                         const CheckpointOptions& options) {
  TESSERA_CHECK_AS(ConfigError, options.keep_last >= 1, "keep_last must be at least 1, got ",
                   options.keep_last);
  TESSERA_CHECK_AS(ConfigError, ckpt.step >= 0, "a checkpoint step must be non-negative, got ",
                   ckpt.step);
  try {
    return save_checkpoint_steps(dir, ckpt, options);
  } catch (const IoError& e) {
    // Say what failed (a full disk, an unwritable directory: the path and the system's reason
    // are in e) and what the user still has.
    std::string still;
    try {
      const auto latest = find_latest_checkpoint(dir);
      still = latest ? "; the latest complete checkpoint is still " + latest->string()
                     : "; there is no earlier complete checkpoint in " + dir.string();
    } catch (const Error&) {
    }
    throw IoError(detail::concat("could not save checkpoint ", step_dir_name(ckpt.step), " in ",
                                 dir.string(), ": ", e.what(), still));
  }
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  for (const fs::path& p : entries_of(dir)) {
    const auto step = parse_step_dir_name(p.filename().string());
    std::error_code ec;
    if (step && fs::is_directory(p, ec) && is_complete(p)) out.emplace_back(*step, p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<fs::path> find_latest_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / kLatestFile, ec)) {
    std::string name = read_file(dir / kLatestFile);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (parse_step_dir_name(name) && is_complete(dir / name)) return dir / name;
  }
  // No pointer, or it names a step directory that is gone or incomplete (a crash between
  // removing and renaming a re-saved step): take the newest complete checkpoint.
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

LoadedCheckpoint load_checkpoint(const fs::path& path, const CheckpointLoadOptions& options) {
  fs::path step_dir = path;
  if (!is_complete(path)) {
    auto found = find_latest_checkpoint(path);
    TESSERA_CHECK_AS(IoError, found.has_value(), "no complete checkpoint in ", path.string(),
                     ": expected a step-<N> directory holding ", kStateFile);
    step_dir = *found;
  }
  const fs::path state_path = step_dir / kStateFile;
  json state;
  try {
    state = parse_json(read_file(state_path));
  } catch (const json::exception& e) {
    throw IoError(detail::concat("the checkpoint state file ", state_path.string(),
                                 " is not valid JSON (", e.what(),
                                 "): the checkpoint is corrupt; use an earlier checkpoint"));
  }
  const json& format = field(state, "format", state_path);
  TESSERA_CHECK_AS(IoError, format == kFormat, state_path.string(), " is not a tessera ",
                   "checkpoint state file: \"format\" is ", format.dump());
  const json& version = field(state, "format_version", state_path);
  TESSERA_CHECK_AS(IoError, version.is_number_integer() && version.get<int>() == kFormatVersion,
                   state_path.string(), " has checkpoint format_version ", version.dump(),
                   "; this build of tessera reads version ", kFormatVersion);
  const json& step = field(state, "step", state_path);
  TESSERA_CHECK_AS(IoError, step.is_number_integer() && step.get<int64_t>() >= 0,
                   state_path.string(),
                   " has a \"step\" that is not a non-negative integer: ", step.dump());
  const json& files = field(state, "files", state_path);
  for (const char* name : {kModelFile, kOptimizerFile, kConfigFile}) {
    verify_file(step_dir, name, field(files, name, state_path), state_path,
                options.verify_checksums);
  }

  LoadedCheckpoint out;
  out.dir = step_dir;
  out.step = step.get<int64_t>();
  out.state = state.contains("state") ? state["state"] : json::object();
  TESSERA_CHECK_AS(IoError, out.state.is_object(), "the checkpoint state file ",
                   state_path.string(),
                   " has a \"state\" that is not an object: the checkpoint is corrupt; use an "
                   "earlier checkpoint");
  const json& tv = field(state, "tessera_version", state_path);
  out.tessera_version = tv.is_string() ? tv.get<std::string>() : tv.dump();
  out.config = read_hf_config(step_dir / kConfigFile);
  out.model = SafetensorsFile(step_dir / kModelFile);
  out.optimizer = SafetensorsFile(step_dir / kOptimizerFile);
  return out;
}

}  // namespace tessera::io
