// CRC-32 (the zlib / PNG / gzip polynomial) of byte ranges and files, used to detect corrupt
// checkpoints; computed by ISA-L (libisal), whose values are zlib's crc32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace tessera::io {

// Size and CRC-32 of a file's bytes.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Continues a CRC-32 over `n` more bytes; start with crc = 0.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

// Reads the whole file; throws IoError naming it when it cannot be read.
FileDigest digest_file(const std::filesystem::path& path);

// "0x1a2b3c4d" and back; parse returns false on anything else.
std::string crc32_hex(uint32_t crc);
bool parse_crc32_hex(const std::string& s, uint32_t* out);

}  // namespace tessera::io
