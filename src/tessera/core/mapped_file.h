// A read-only memory map of a whole file (RAII, move-only). Pages are read on first touch, so
// taking a slice of a large file reads only that slice from disk. An empty file is not mapped
// (mmap of 0 bytes fails): data() is then nullptr and size() 0.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string_view>

namespace tessera {

class MappedFile {
 public:
  MappedFile() = default;  // maps nothing
  // Maps `path` read-only. Throws IoError naming the path when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data_), size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void release() noexcept;
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace tessera
