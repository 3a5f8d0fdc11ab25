#include "tessera/train/attempt_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/comm/errors.h"
#include "tessera/comm/fault.h"
#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"

namespace tessera::train {

namespace {

int heartbeat_fd() {
  static const int fd = [] {
    const char* s = std::getenv("TESSERA_HEARTBEAT");
    if (s == nullptr || *s == '\0') return -1;
    return ::open(s, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);  // -1: no heartbeat, no error
  }();
  return fd;
}

std::string failure_dir() {
  const char* s = std::getenv("TESSERA_FAILURE_DIR");
  return s == nullptr ? std::string() : std::string(s);
}

void write_json(const std::string& path, const nlohmann::json& j) {
  try {
    io::write_file_atomic(path, j.dump(1) + "\n");
  } catch (const std::exception&) {
    // A report that cannot be written must not hide the failure being reported.
  }
}

}  // namespace

const char* fate_name(RankFate f) {
  switch (f) {
    case RankFate::Finished:
      return "finished";
    case RankFate::Failed:
      return "failed";
    case RankFate::PeerFailed:
      return "peer_failed";
    case RankFate::Exited:
      return "exited";
  }
  return "failed";
}

void report_heartbeat(int64_t step) {
  const int fd = heartbeat_fd();
  if (fd < 0) return;
  static int64_t start = step;  // the first call's: where this attempt started training
  // One line, rewritten in place at a fixed width (steps only grow within an attempt).
  char line[64];
  const int n = std::snprintf(line, sizeof line, "start %-20lld step %-20lld\n",
                              static_cast<long long>(start), static_cast<long long>(step));
  [[maybe_unused]] const ssize_t w = ::pwrite(fd, line, static_cast<size_t>(n), 0);
}

RankFate fate_of(const std::exception_ptr& e) {
  if (!e) return RankFate::Finished;
  try {
    std::rethrow_exception(e);
  } catch (const comm::InjectedExit&) {
    return RankFate::Exited;
  } catch (const comm::PeerFailedError&) {
    return RankFate::PeerFailed;
  } catch (...) {
    return RankFate::Failed;
  }
}

void report_rank_fates(int first_world_rank, const std::vector<RankFate>& fates) {
  const std::string dir = failure_dir();
  if (dir.empty()) return;
  nlohmann::json ranks = nlohmann::json::object();
  for (size_t i = 0; i < fates.size(); ++i)
    ranks[std::to_string(first_world_rank + static_cast<int>(i))] = fate_name(fates[i]);
  write_json(detail::concat(dir, "/ranks-", first_world_rank, ".json"), {{"ranks", ranks}});
}

void report_process_error(const std::string& kind, const std::string& message) {
  const std::string dir = failure_dir();
  if (dir.empty()) return;
  write_json(detail::concat(dir, "/error-", ::getpid(), ".json"),
             {{"kind", kind}, {"message", message}});
}

bool AttemptFailure::config_error() const {
  return std::find(kinds.begin(), kinds.end(), "config") != kinds.end();
}

AttemptFailure read_attempt_failure(const std::string& dir) {
  AttemptFailure out;
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    nlohmann::json j;
    try {
      std::ifstream in(path);
      j = nlohmann::json::parse(in);
    } catch (const std::exception&) {
      continue;  // a report cut short by the crash it reports
    }
    if (!j.is_object()) continue;
    if (j.contains("ranks") && j["ranks"].is_object()) {
      for (const auto& [rank, fate] : j["ranks"].items()) {
        if (!fate.is_string()) continue;
        RankFate f = RankFate::Failed;
        for (RankFate c :
             {RankFate::Finished, RankFate::Failed, RankFate::PeerFailed, RankFate::Exited})
          if (fate.get<std::string>() == fate_name(c)) f = c;
        out.fates[std::atoi(rank.c_str())] = f;
      }
    }
    if (j.contains("kind") && j["kind"].is_string()) {
      out.kinds.push_back(j["kind"].get<std::string>());
      if (out.message.empty() && j.contains("message") && j["message"].is_string())
        out.message = j["message"].get<std::string>();
    }
  }
  return out;
}

}  // namespace tessera::train
