// Helpers shared by the data tests.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace tessera::data::testing {

// A fresh, empty directory under the test temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_file(const std::filesystem::path& path, std::string_view bytes);
std::string read_file(const std::filesystem::path& path);

// A small English-like corpus (a few KB), deterministic.
std::string small_corpus();

}  // namespace tessera::data::testing
