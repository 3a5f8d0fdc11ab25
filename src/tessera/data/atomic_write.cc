#include "tessera/data/atomic_write.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <system_error>

#include "tessera/core/error.h"

namespace tessera::data {

void write_file_atomically(const std::filesystem::path& path,
                           std::initializer_list<std::string_view> parts) {
  static std::atomic<uint64_t> counter{0};
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  // Unique per process and call, so concurrent writers never share a temporary file.
  const std::filesystem::path tmp =
      path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    for (std::string_view p : parts) f.write(p.data(), static_cast<std::streamsize>(p.size()));
    f.flush();
    if (!f.good()) {
      f.close();
      std::filesystem::remove(tmp, ec);
      throw IoError(detail::concat("Could not write ", path.string(),
                                   "; check that the directory is writable and has free space."));
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw IoError(detail::concat("Could not move ", tmp.string(), " to ", path.string(), ": ",
                                 ec.message(), "."));
  }
}

}  // namespace tessera::data
