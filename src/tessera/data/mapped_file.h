// A read-only memory map of a whole file (RAII). Move-only.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace tessera::data {

class MappedFile {
 public:
  // Maps `path` read-only. Throws IoError naming the path when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data_), size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void release();
  std::filesystem::path path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace tessera::data
