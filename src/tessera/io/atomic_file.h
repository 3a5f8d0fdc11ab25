// Crash-safe file replacement. A reader of `path` sees either the old file or the complete new
// one, never a partial write, even if the process or the machine dies mid-write:
//   1. write into `path.tmp.<pid>.<counter>.<random>` in the same directory (same file
//      system); the name is unique per call and thread, so concurrent writers never share it,
//      (large files bypass the page cache: O_DIRECT, see AtomicFileWriter's staging buffer),
//   2. fsync the temporary, 3. rename it over `path` (atomic on POSIX),
//   4. fsync the directory so the rename itself is durable.
// On any failure the temporary is removed and `path` keeps its old contents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
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
  void write_out(const char* p, size_t bytes);  // to the file, all of it
  void flush_staging();                         // the staging buffer's whole chunk
  void set_direct(bool on);                     // O_DIRECT on fd_ (on: where it is taken)

  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  FileDigest digest_;
  bool done_ = false;
  // Writes go through an aligned staging buffer of kStagingBytes; each full chunk is written
  // with O_DIRECT where the file system takes it (set on the descriptor at the first full chunk,
  // so small files never use it), which spares the kernel's copy into the page cache: most of
  // the CPU a large checkpoint's write cost here (docs/PERFORMANCE.md). The tail is written
  // buffered at commit.
  static constexpr size_t kStagingBytes = size_t{4} << 20;
  struct FreeDeleter {
    void operator()(char* p) const noexcept;
  };
  std::unique_ptr<char, FreeDeleter> staging_;
  size_t staged_ = 0;
  bool direct_ = false;        // O_DIRECT is set on fd_
  bool direct_tried_ = false;  // whether setting it was attempted
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
