// Crash-safe file replacement. A reader of `path` sees either the old file or the complete new
// one, never a partial write, even if the process or the machine dies mid-write:
//   1. write into `path.tmp.<pid>.<counter>.<random>` in the same directory (same file
//      system); the name is unique per call and thread, so concurrent writers never share it,
//   2. fsync the temporary, 3. rename it over `path` (atomic on POSIX),
//   4. fsync the directory so the rename itself is durable.
// On any failure the temporary is removed and `path` keeps its old contents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "tessera/io/checksum.h"

namespace tessera::io {

class AtomicFileWriter {
 public:
  // Creates the temporary. Throws IoError naming `target` (e.g. missing parent directory).
  explicit AtomicFileWriter(std::filesystem::path target);
  // Without commit(): closes and removes the temporary; `target` is untouched.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync, rename over the target, fsync the directory. Returns the size and CRC-32 written.
  FileDigest commit();

  const std::filesystem::path& target() const { return target_; }
  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  void discard() noexcept;

  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  FileDigest digest_;
  bool done_ = false;
};

// Replaces `path` with `contents` atomically (see above).
FileDigest write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// Makes renames and creations inside `dir` durable. Throws IoError naming `dir`.
void fsync_directory(const std::filesystem::path& dir);

// Creates `dir` (and its parents) when missing and checks that files can be created in it, by
// creating and removing a temporary file, so that a run fails before it starts rather than at
// its first save. Throws IoError naming `dir` and the system's reason.
void check_writable_directory(const std::filesystem::path& dir);

// The whole file as bytes. Throws IoError naming `path`.
std::string read_file(const std::filesystem::path& path);

}  // namespace tessera::io
