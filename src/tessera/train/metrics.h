// Metrics as JSON lines: one object per training step ({"step","loss","lr","tokens_per_s",...})
// and one per validation ({"step","val_loss"}). Each line is flushed as it is written, so a
// crashed run keeps every record up to the crash.
#pragma once

#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace tessera::train {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens `path` (append when `append`, for a resumed run); "" writes nothing.
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace tessera::train
