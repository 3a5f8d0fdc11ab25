#include "tessera/plan/cluster.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessera/core/error.h"

#ifndef TESSERA_CLUSTER_DIR
#define TESSERA_CLUSTER_DIR ""
#endif
#ifndef TESSERA_INSTALLED_CLUSTER_DIR
#define TESSERA_INSTALLED_CLUSTER_DIR ""
#endif

namespace tessera::plan {

namespace fs = std::filesystem;

double ClusterSpec::peak_flops(const std::string& dtype) const {
  auto it = peak_tflops.find(dtype);
  TESSERA_CHECK_AS(ConfigError, it != peak_tflops.end() && it->second > 0, "cluster '", name,
                   "' gives no peak FLOP/s for ", dtype, " (peak_tflops.", dtype, ")");
  return it->second * 1e12;
}

namespace {

const nlohmann::json& need(const nlohmann::json& j, const char* key, const std::string& source) {
  TESSERA_CHECK_AS(ConfigError, j.contains(key), source, ": missing '", key, "'");
  return j.at(key);
}

double positive(const nlohmann::json& j, const char* key, const std::string& source,
                bool allow_zero = false) {
  const nlohmann::json& v = need(j, key, source);
  TESSERA_CHECK_AS(ConfigError,
                   v.is_number() && (allow_zero ? v.get<double>() >= 0 : v.get<double>() > 0),
                   source, ": '", key, "' must be a ", allow_zero ? "non-negative" : "positive",
                   " number, got ", v.dump());
  return v.get<double>();
}

LinkSpec link_from_json(const nlohmann::json& j, const char* key, const std::string& source) {
  const nlohmann::json& l = need(j, key, source);
  TESSERA_CHECK_AS(ConfigError, l.is_object(), source, ": '", key, "' must be an object");
  const std::string where = source + " (" + key + ")";
  return LinkSpec{positive(l, "bandwidth_gbs", where), positive(l, "latency_us", where, true)};
}

nlohmann::json link_json(const LinkSpec& l) {
  return {{"bandwidth_gbs", l.bandwidth_gbs}, {"latency_us", l.latency_us}};
}

}  // namespace

ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& source) {
  TESSERA_CHECK_AS(ConfigError, j.is_object(), source,
                   ": a cluster description must be a JSON object");
  static const std::vector<std::string> known = {
      "name",        "description",       "sources",
      "nodes",       "devices_per_node",  "device_memory_gib",
      "peak_tflops", "matmul_efficiency", "memory_bandwidth_gbs",
      "intra_node",  "inter_node",        "engine",
      "precision",   "dp_overlap",        "reserved_gib",
      "calibration", "gemm_efficiency",   "attention_efficiency"};
  for (const auto& [k, v] : j.items()) {
    (void)v;
    TESSERA_CHECK_AS(ConfigError, std::find(known.begin(), known.end(), k) != known.end(), source,
                     ": unknown key '", k, "'");
  }
  ClusterSpec c;
  c.name = need(j, "name", source).get<std::string>();
  c.description = j.value("description", std::string());
  if (j.contains("sources")) c.sources = j.at("sources").get<std::vector<std::string>>();
  c.nodes = static_cast<int>(positive(j, "nodes", source));
  c.devices_per_node = static_cast<int>(positive(j, "devices_per_node", source));
  c.device_memory_gib = positive(j, "device_memory_gib", source);
  const nlohmann::json& peaks = need(j, "peak_tflops", source);
  TESSERA_CHECK_AS(ConfigError, peaks.is_object() && !peaks.empty(), source,
                   ": 'peak_tflops' must be an object of dtype: TFLOP/s");
  for (const auto& [dtype, v] : peaks.items())
    c.peak_tflops[dtype] = positive(peaks, dtype.c_str(), source + " (peak_tflops)");
  c.matmul_efficiency = positive(j, "matmul_efficiency", source);
  TESSERA_CHECK_AS(ConfigError, c.matmul_efficiency <= 1, source,
                   ": 'matmul_efficiency' is a fraction of the peak, at most 1");
  if (j.contains("gemm_efficiency"))
    c.gemm_efficiency = gemm_efficiency_from_json(j.at("gemm_efficiency"), source);
  if (j.contains("attention_efficiency"))
    c.attention_efficiency = attention_efficiency_from_json(j.at("attention_efficiency"), source);
  c.memory_bandwidth_gbs = positive(j, "memory_bandwidth_gbs", source);
  c.intra_node = link_from_json(j, "intra_node", source);
  c.inter_node = link_from_json(j, "inter_node", source);
  c.engine = j.value("engine", std::string("megatron"));
  TESSERA_CHECK_AS(ConfigError, c.engine == "megatron" || c.engine == "tessera", source,
                   ": 'engine' must be \"megatron\" or \"tessera\", got \"", c.engine, "\"");
  c.precision = j.value("precision", std::string("bf16"));
  (void)c.peak_flops(c.precision);  // the default precision needs a peak
  if (j.contains("dp_overlap")) c.dp_overlap = positive(j, "dp_overlap", source, true);
  TESSERA_CHECK_AS(ConfigError, c.dp_overlap <= 1, source,
                   ": 'dp_overlap' is a fraction, at most 1");
  if (j.contains("reserved_gib")) c.reserved_gib = positive(j, "reserved_gib", source, true);
  if (j.contains("calibration")) c.calibration = j.at("calibration");
  return c;
}

nlohmann::json to_json(const ClusterSpec& c) {
  nlohmann::json j = {{"name", c.name},
                      {"description", c.description},
                      {"sources", c.sources},
                      {"nodes", c.nodes},
                      {"devices_per_node", c.devices_per_node},
                      {"device_memory_gib", c.device_memory_gib},
                      {"peak_tflops", c.peak_tflops},
                      {"matmul_efficiency", c.matmul_efficiency},
                      {"memory_bandwidth_gbs", c.memory_bandwidth_gbs},
                      {"intra_node", link_json(c.intra_node)},
                      {"inter_node", link_json(c.inter_node)},
                      {"engine", c.engine},
                      {"precision", c.precision},
                      {"dp_overlap", c.dp_overlap},
                      {"reserved_gib", c.reserved_gib}};
  if (!c.gemm_efficiency.empty()) j["gemm_efficiency"] = to_json(c.gemm_efficiency);
  if (!c.attention_efficiency.empty()) j["attention_efficiency"] = to_json(c.attention_efficiency);
  if (!c.calibration.is_null()) j["calibration"] = c.calibration;
  return j;
}

namespace {

std::vector<fs::path> cluster_dirs() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("TESSERA_CLUSTER_PATH")) {
    std::stringstream ss(env);
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty()) dirs.emplace_back(d);
  }
  for (const char* d : {TESSERA_CLUSTER_DIR, TESSERA_INSTALLED_CLUSTER_DIR})
    if (*d && fs::is_directory(d)) dirs.emplace_back(d);
  return dirs;
}

ClusterSpec read_cluster_file(const fs::path& p) {
  std::ifstream in(p);
  TESSERA_CHECK_AS(IoError, in.good(), "cannot read the cluster description '", p.string(), "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(detail::concat(p.string(), ": not valid JSON: ", e.what()));
  }
  try {
    return cluster_from_json(j, p.string());
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(detail::concat(p.string(), ": a field has the wrong type: ", e.what()));
  }
}

}  // namespace

std::vector<std::string> shipped_cluster_names() {
  std::vector<std::string> names;
  for (const fs::path& d : cluster_dirs()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

ClusterSpec load_cluster(const std::string& name_or_path) {
  if (fs::exists(name_or_path) && fs::is_regular_file(name_or_path))
    return read_cluster_file(name_or_path);
  for (const fs::path& d : cluster_dirs()) {
    const fs::path p = d / (name_or_path + ".json");
    if (fs::exists(p)) return read_cluster_file(p);
  }
  std::string names;
  for (const std::string& n : shipped_cluster_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError(detail::concat("--cluster '", name_or_path,
                                   "' is neither a file nor a shipped cluster description (",
                                   names.empty() ? "none found" : names, ")"));
}

ClusterSpec with_devices(ClusterSpec c, int devices) {
  TESSERA_CHECK_AS(ConfigError, devices >= 1, "--devices must be positive, got ", devices);
  if (devices <= c.devices_per_node) {
    c.nodes = 1;
    c.devices_per_node = devices;  // a part of one node
  } else {
    TESSERA_CHECK_AS(ConfigError, devices % c.devices_per_node == 0, "--devices ", devices,
                     " is not a whole number of ", c.name, " nodes (", c.devices_per_node,
                     " devices each)");
    c.nodes = devices / c.devices_per_node;
  }
  return c;
}

}  // namespace tessera::plan
