#include "tessera/core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "tessera/core/error.h"

namespace tessera {

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  TESSERA_CHECK_AS(IoError, fd >= 0, "cannot open ", path.string(),
                   " for reading: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError(detail::concat("cannot stat ", path.string(), ": ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(detail::concat("cannot map ", path.string(), ": it is not a regular file"));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size > 0) {  // mmap of 0 bytes fails with EINVAL; an empty file maps to nothing
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw IoError(
          detail::concat("cannot map ", path.string(), " into memory: ", std::strerror(err)));
    }
    data_ = static_cast<const std::byte*>(p);
    size_ = size;
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace tessera
