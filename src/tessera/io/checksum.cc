#include "tessera/io/checksum.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "tessera/core/error.h"

namespace tessera::io {

// ISA-L's gzip CRC-32 is zlib's crc32 (same polynomial, reflection and inversions, so the same
// values and checkpoints) computed with carry-less multiplication where the CPU has it (chosen at
// run time): 6-10 GB/s here against zlib's 2.4 (docs/PERFORMANCE.md), which a checkpoint's
// save and load each pay once per byte.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  return ::crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), n);
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
