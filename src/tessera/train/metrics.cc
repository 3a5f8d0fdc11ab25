#include "tessera/train/metrics.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"

namespace tessera::train {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
  }
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  TESSERA_CHECK_AS(IoError, f_ != nullptr, "cannot open metrics file '", path,
                   "' for writing: ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!f_) return;
  std::string line = record.dump() + "\n";
  bool ok = std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0;
  TESSERA_CHECK_AS(IoError, ok, "cannot write to metrics file '", path_,
                   "': ", std::strerror(errno));
}

}  // namespace tessera::train
