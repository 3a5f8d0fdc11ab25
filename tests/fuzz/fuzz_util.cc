#include "fuzz_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tessera::fuzz {
namespace {

std::filesystem::path make_scratch() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/tessera-fuzz-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::fprintf(stderr, "fuzz: cannot create a scratch directory %s: %s\n", pattern.c_str(),
                 std::strerror(errno));
    std::abort();
  }
  return pattern;
}

// Never destroyed, so that the exit handler below can still read it (a function-local static
// would be destroyed before a handler registered while constructing it runs).
const std::filesystem::path* g_scratch = nullptr;

void remove_scratch() {
  std::error_code ec;
  std::filesystem::remove_all(*g_scratch, ec);
}

const std::filesystem::path& scratch() {
  if (g_scratch == nullptr) {
    g_scratch = new std::filesystem::path(make_scratch());
    std::atexit(remove_scratch);
  }
  return *g_scratch;
}

}  // namespace

const std::filesystem::path& scratch_dir() {
  return scratch();
}

void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  bool ok = fd >= 0;
  while (ok && size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) {
      data += n;
      size -= static_cast<size_t>(n);
    }
  }
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    std::fprintf(stderr, "fuzz: cannot write the input to %s: %s\n", path.c_str(),
                 std::strerror(err));
    std::abort();
  }
}

std::filesystem::path write_input(std::string_view name, const uint8_t* data, size_t size) {
  std::filesystem::path p = scratch() / name;
  write_file(p, data, size);
  return p;
}

void rejected(const Error& e) {
  static const bool verbose = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "rejected: %s\n", e.what());
}

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: property violated: %s\n", what);
  std::abort();
}

}  // namespace tessera::fuzz
