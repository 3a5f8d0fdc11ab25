// Token files on disk, memory-mapped for reading:
//   * the project's token file: a 64-byte header (magic "TSRTOK01", see docs/DATA.md) followed
//     by little-endian uint16 or uint32 ids, with an FNV-1a 64 checksum of the payload;
//   * nanoGPT's raw token files (train.bin / val.bin): headerless little-endian uint16.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "tessera/core/mapped_file.h"
#include "tessera/data/token_source.h"

namespace tessera::data {

inline constexpr std::string_view kTokenFileMagic = "TSRTOK01";
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr std::size_t kTokenFileHeaderBytes = 64;

// Writes `tokens` as a tessera token file (atomically: a temporary file, then a rename). The ids
// are stored as uint16 when vocab_size <= 65536, else uint32; vocab_size is recorded in the
// header. Throws ConfigError when an id is >= vocab_size, IoError when the file cannot be written.
void write_token_file(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                      uint32_t vocab_size);

// True when the file starts with the token-file magic (false when it cannot be read).
bool has_token_file_magic(const std::filesystem::path& path);

struct TokenFileOptions {
  // Check the payload checksum on open (one pass over the file). open() is lazy without it;
  // verify_checksum() can still be called later.
  bool verify_checksum = true;
};

// A memory-mapped token file of either kind. Thread-safe for concurrent reads.
class TokenFile final : public TokenSource {
 public:
  enum class Format { kTessera, kRawUint16 };

  // Opens a tessera token file. Throws IoError naming the file when the magic, version, dtype,
  // size or (when verified) checksum is wrong.
  static std::shared_ptr<TokenFile> open(const std::filesystem::path& path,
                                         const TokenFileOptions& options = {});
  // Opens a headerless little-endian uint16 file. Throws IoError when its size is odd.
  static std::shared_ptr<TokenFile> open_raw_uint16(const std::filesystem::path& path);

  int64_t size() const override { return count_; }
  uint32_t get(int64_t i) const override;
  void read(int64_t first, int64_t n, int32_t* out) const override;
  std::string name() const override { return file_.path().string(); }

  Format format() const { return format_; }
  // Bytes per id: 2 or 4.
  int token_bytes() const { return token_bytes_; }
  // Vocabulary size recorded in the header; 0 for raw files (unknown).
  uint32_t vocab_size() const { return vocab_size_; }
  // Recomputes the payload checksum; throws IoError naming the file on mismatch. No-op for raw.
  void verify_checksum() const;

 private:
  TokenFile(MappedFile file, Format format) : file_(std::move(file)), format_(format) {}
  MappedFile file_;
  Format format_;
  const unsigned char* payload_ = nullptr;
  int64_t count_ = 0;
  int token_bytes_ = 2;
  uint32_t vocab_size_ = 0;
  uint64_t checksum_ = 0;
};

}  // namespace tessera::data
