// Reads one quantity out of a metrics file (JSON lines, train/metrics.h) as (step, value) points:
// "loss" from the training lines, "val_loss" from the validation lines, or any other numeric key.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tessera::viz {

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (step, value), by step
};

// The points of `key` in the JSON-lines file at `path`, sorted by step; when a step appears more
// than once (a resumed run appends), the last line wins. Lines without "step" or without a
// numeric `key` are skipped. Throws IoError for an unreadable file or a line that is not a JSON
// object (naming path:line), ConfigError when no line has `key`.
Series read_metrics_series(const std::string& path, const std::string& key,
                           const std::string& label);

}  // namespace tessera::viz
