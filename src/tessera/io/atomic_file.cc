#include "tessera/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "tessera/core/error.h"

namespace tessera::io {
namespace {

// Unique per call: the pid separates processes, the counter separates calls (from any thread)
// within one, and the random part separates a process from a dead one that had the same pid and
// left its temporary behind. Concurrent writers of one path (e.g. ranks preparing the same
// cache) therefore never share a temporary; O_EXCL below would refuse one that exists anyway.
std::filesystem::path temp_name_for(const std::filesystem::path& target) {
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = counter.fetch_add(1, std::memory_order_relaxed);
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char suffix[80];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%llu.%016llx", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(n), static_cast<unsigned long long>(r));
  std::filesystem::path p = target;
  p += suffix;
  return p;
}

std::filesystem::path parent_or_dot(const std::filesystem::path& p) {
  std::filesystem::path parent = p.parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::filesystem::path target)
    : target_(std::move(target)), temp_(temp_name_for(target_)) {
  do {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    const int err = errno;
    done_ = true;  // nothing to clean up
    throw IoError(detail::concat("cannot write ", target_.string(),
                                 ": creating the temporary file ", temp_.string(),
                                 " failed: ", std::strerror(err)));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!done_) discard();
}

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_.c_str());
  done_ = true;
}

void AtomicFileWriter::fail(const std::string& what, int err) {
  discard();
  throw IoError(detail::concat("cannot write ", target_.string(), ": ", what, " failed: ",
                               std::strerror(err), "; the previous file, if any, is unchanged"));
}

void AtomicFileWriter::FreeDeleter::operator()(char* p) const noexcept {
  std::free(p);
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  TESSERA_CHECK_AS(IoError, !done_, "cannot write ", target_.string(),
                   ": the atomic writer was already committed or abandoned");
  digest_.bytes += bytes;
  if (!staging_) {
    staging_.reset(static_cast<char*>(std::aligned_alloc(4096, kStagingBytes)));
    TESSERA_CHECK_AS(IoError, staging_ != nullptr, "cannot write ", target_.string(),
                     ": no memory for a staging buffer of ", kStagingBytes, " bytes");
  }
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t n = std::min(bytes, kStagingBytes - staged_);
    // The checksum reads the copy while it is still in cache, not the source a second time.
    std::memcpy(staging_.get() + staged_, p, n);
    digest_.crc32 = crc32_update(digest_.crc32, staging_.get() + staged_, n);
    staged_ += n, p += n, bytes -= n;
    if (staged_ == kStagingBytes) flush_staging();
  }
}

void AtomicFileWriter::flush_staging() {
  if (!direct_tried_) {  // a large file: bypass the page cache where the file system allows
    direct_tried_ = true;
    set_direct(true);
  }
  write_out(staging_.get(), staged_);
  staged_ = 0;
}

void AtomicFileWriter::set_direct(bool on) {
  const int flags = ::fcntl(fd_, F_GETFL);
  const bool done =
      flags >= 0 && ::fcntl(fd_, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) == 0;
  direct_ = on ? done : false;
}

void AtomicFileWriter::write_out(const char* p, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      // O_DIRECT refused after all (some file systems say so only at the write): buffered then.
      if (direct_ && err == EINVAL) {
        set_direct(false);
        continue;
      }
      fail("writing the temporary file " + temp_.string(), err);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    if (bytes > 0 && direct_) set_direct(false);  // a short direct write: unaligned from here
  }
}

FileDigest AtomicFileWriter::commit() {
  TESSERA_CHECK_AS(IoError, !done_, "cannot write ", target_.string(),
                   ": the atomic writer was already committed or abandoned");
  if (staged_ > 0) {  // the tail, unaligned: buffered
    if (direct_) set_direct(false);
    write_out(staging_.get(), staged_);
    staged_ = 0;
  }
  staging_.reset();
  // errno is read before the message is built: building it allocates, which may change errno.
  if (::fsync(fd_) != 0) {
    const int err = errno;
    fail("fsync of the temporary file " + temp_.string(), err);
  }
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) {
    const int err = errno;
    fail("closing the temporary file " + temp_.string(), err);
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    fail("renaming " + temp_.string() + " over it", err);
  }
  done_ = true;
  fsync_directory(parent_or_dot(target_));
  return digest_;
}

FileDigest write_file_atomic(const std::filesystem::path& path, std::string_view contents) {
  AtomicFileWriter w(path);
  w.write(contents);
  return w.commit();
}

void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int open_err = errno;
  TESSERA_CHECK_AS(IoError, fd >= 0, "cannot open directory ", dir.string(),
                   " to make its entries durable: ", std::strerror(open_err));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); their renames are as durable as they get.
  TESSERA_CHECK_AS(IoError, rc == 0 || err == EINVAL, "fsync of directory ", dir.string(),
                   " failed: ", std::strerror(err));
}

void check_writable_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TESSERA_CHECK_AS(IoError, !ec, "cannot create the directory ", dir.string(), ": ", ec.message());
  TESSERA_CHECK_AS(IoError, std::filesystem::is_directory(dir, ec), "cannot write into ",
                   dir.string(), ": it exists and is not a directory");
  const std::filesystem::path probe = temp_name_for(dir / ".tessera-write-check");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const int err = errno;
  TESSERA_CHECK_AS(IoError, fd >= 0, "cannot write into the directory ", dir.string(),
                   ": creating a file there failed: ", std::strerror(err));
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string read_file(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  const int open_err = errno;
  TESSERA_CHECK_AS(IoError, f != nullptr, "cannot open ", path.string(),
                   " for reading: ", std::strerror(open_err));
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  TESSERA_CHECK_AS(IoError, !failed, "reading ", path.string(), " failed: ", std::strerror(err));
  return out;
}

}  // namespace tessera::io
