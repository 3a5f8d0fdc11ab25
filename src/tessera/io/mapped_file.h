// A read-only memory map of a whole file. Pages are read on first touch, so taking a slice of a
// large file reads only that slice from disk.
#pragma once

#include <cstddef>
#include <filesystem>

namespace tessera::io {

class MappedFile {
 public:
  MappedFile() = default;  // maps nothing
  // Throws IoError naming `path` when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void reset() noexcept;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tessera::io
