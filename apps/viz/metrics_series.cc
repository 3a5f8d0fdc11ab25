#include "viz/metrics_series.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"

namespace tessera::viz {

Series read_metrics_series(const std::string& path, const std::string& key,
                           const std::string& label) {
  std::ifstream in(path);
  TESSERA_CHECK_AS(IoError, in.good(), "cannot read the metrics file ", path);
  std::map<double, double> by_step;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw IoError(detail::concat(path, ":", line_no, ": not a JSON line"));
    }
    TESSERA_CHECK_AS(IoError, j.is_object(), path, ":", line_no, ": not a JSON object");
    if (!j.contains("step") || !j["step"].is_number() || !j.contains(key) || !j[key].is_number())
      continue;
    by_step[j["step"].get<double>()] = j[key].get<double>();
  }
  TESSERA_CHECK_AS(ConfigError, !by_step.empty(), path, " has no lines with a step and a '", key,
                   "' value");
  Series s;
  s.label = label;
  s.points.assign(by_step.begin(), by_step.end());
  return s;
}

}  // namespace tessera::viz
