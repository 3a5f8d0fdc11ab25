#include "tessera/io/checksum.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "tessera/core/error.h"

namespace tessera::io {

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    // zlib takes uInt lengths, so feed very large ranges in pieces.
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    c = ::crc32(c, p, static_cast<uInt>(chunk));
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

FileDigest digest_file(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  TESSERA_CHECK_AS(IoError, f != nullptr, "cannot open ", path.string(),
                   " to compute its checksum: ", std::strerror(errno));
  FileDigest d;
  std::vector<unsigned char> buf(size_t{1} << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    d.crc32 = crc32_update(d.crc32, buf.data(), n);
    d.bytes += n;
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  TESSERA_CHECK_AS(IoError, !failed, "reading ", path.string(),
                   " to compute its checksum failed: ", std::strerror(err));
  return d;
}

std::string crc32_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", crc);
  return buf;
}

bool parse_crc32_hex(const std::string& s, uint32_t* out) {
  if (s.size() != 10 || s[0] != '0' || s[1] != 'x') return false;
  uint32_t v = 0;
  for (size_t i = 2; i < s.size(); ++i) {
    const char c = s[i];
    uint32_t digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint32_t>(c - 'a' + 10);
    } else {
      return false;
    }
    v = (v << 4) | digit;
  }
  *out = v;
  return true;
}

}  // namespace tessera::io
