#include "tessera/data/token_file.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <system_error>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/io/atomic_file.h"

namespace tessera::data {
namespace {

// Header layout (all little-endian):
//   0  char[8]  magic "TSRTOK01"
//   8  u32      version (1)
//  12  u32      bytes per token (2 = uint16, 4 = uint32)
//  16  u64      number of tokens
//  24  u64      FNV-1a 64 checksum of the payload bytes
//  32  u32      vocabulary size (0 = unknown)
//  36  u32      header size in bytes (64)
//  40  u8[24]   reserved, zero
void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
inline uint32_t load_le16(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}
inline uint32_t load_le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

uint64_t payload_checksum(const unsigned char* p, std::size_t n) {
  return stable_hash(std::string_view(reinterpret_cast<const char*>(p), n));
}

[[noreturn]] void corrupt(const std::filesystem::path& path, const std::string& what) {
  throw IoError(detail::concat("the token file ", path.string(), " is corrupt: ", what,
                               "; recreate it (delete it and rerun to re-tokenize the corpus)"));
}

}  // namespace

void write_token_file(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                      uint32_t vocab_size) {
  TESSERA_CHECK_AS(ConfigError, vocab_size > 0, "cannot write ", path.string(),
                   ": the vocabulary size must be positive");
  const int width = vocab_size <= 65536 ? 2 : 4;
  std::vector<unsigned char> payload(tokens.size() * static_cast<std::size_t>(width));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t t = tokens[i];
    TESSERA_CHECK_AS(ConfigError, t < vocab_size, "cannot write ", path.string(), ": token id ", t,
                     " at position ", i, " is not below the vocabulary size ", vocab_size);
    unsigned char* p = payload.data() + i * static_cast<std::size_t>(width);
    if (width == 2) {
      p[0] = static_cast<unsigned char>(t);
      p[1] = static_cast<unsigned char>(t >> 8);
    } else {
      put_u32(p, t);
    }
  }
  unsigned char header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic.data(), kTokenFileMagic.size());
  put_u32(header + 8, kTokenFileVersion);
  put_u32(header + 12, static_cast<uint32_t>(width));
  put_u64(header + 16, tokens.size());
  put_u64(header + 24, payload_checksum(payload.data(), payload.size()));
  put_u32(header + 32, vocab_size);
  put_u32(header + 36, static_cast<uint32_t>(kTokenFileHeaderBytes));

  // Parent directories first; if that fails, the writer below throws an IoError naming the path.
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  io::AtomicFileWriter w(path);
  w.write(header, sizeof(header));
  w.write(payload.data(), payload.size());
  w.commit();
}

bool has_token_file_magic(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  char buf[8] = {};
  if (!f.read(buf, sizeof(buf))) return false;
  return std::string_view(buf, sizeof(buf)) == kTokenFileMagic;
}

std::shared_ptr<TokenFile> TokenFile::open(const std::filesystem::path& path,
                                           const TokenFileOptions& options) {
  std::shared_ptr<TokenFile> tf(new TokenFile(MappedFile(path), Format::kTessera));
  const MappedFile& m = tf->file_;
  const auto* h = reinterpret_cast<const unsigned char*>(m.data());
  if (m.size() < kTokenFileHeaderBytes)
    corrupt(path, detail::concat("it has ", m.size(), " bytes, fewer than the ",
                                 kTokenFileHeaderBytes, "-byte header"));
  if (std::memcmp(h, kTokenFileMagic.data(), kTokenFileMagic.size()) != 0)
    corrupt(path, detail::concat("it does not start with the magic \"", kTokenFileMagic, "\""));
  const uint32_t version = get_u32(h + 8);
  if (version != kTokenFileVersion)
    corrupt(path, detail::concat("its version is ", version, "; this build reads version ",
                                 kTokenFileVersion));
  const uint32_t width = get_u32(h + 12);
  if (width != 2 && width != 4)
    corrupt(path, detail::concat("its token width is ", width, " bytes; accepted: 2 or 4"));
  const uint32_t header_bytes = get_u32(h + 36);
  if (header_bytes != kTokenFileHeaderBytes)
    corrupt(path,
            detail::concat("its header size is ", header_bytes, ", not ", kTokenFileHeaderBytes));
  const uint64_t count = get_u64(h + 16);
  const uint64_t payload = m.size() - kTokenFileHeaderBytes;
  if (count > payload / width || count * width != payload)
    corrupt(path, detail::concat("the header promises ", count, " tokens of ", width, " bytes (",
                                 kTokenFileHeaderBytes + count * width,
                                 " bytes in all) but the file has ", m.size(),
                                 " bytes (truncated or overwritten?)"));
  tf->payload_ = h + kTokenFileHeaderBytes;
  tf->count_ = static_cast<int64_t>(count);
  tf->token_bytes_ = static_cast<int>(width);
  tf->vocab_size_ = get_u32(h + 32);
  tf->checksum_ = get_u64(h + 24);
  if (options.verify_checksum) tf->verify_checksum();
  return tf;
}

std::shared_ptr<TokenFile> TokenFile::open_raw_uint16(const std::filesystem::path& path) {
  std::shared_ptr<TokenFile> tf(new TokenFile(MappedFile(path), Format::kRawUint16));
  const std::size_t bytes = tf->file_.size();
  TESSERA_CHECK_AS(IoError, bytes % 2 == 0, "the raw token file ", path.string(), " has ", bytes,
                   " bytes, an odd number; a raw .bin file must hold little-endian uint16 token "
                   "ids (2 bytes each), as nanoGPT's prepare.py writes them");
  tf->payload_ = reinterpret_cast<const unsigned char*>(tf->file_.data());
  tf->count_ = static_cast<int64_t>(bytes / 2);
  tf->token_bytes_ = 2;
  return tf;
}

void TokenFile::verify_checksum() const {
  if (format_ != Format::kTessera) return;
  const uint64_t actual = payload_checksum(
      payload_, static_cast<std::size_t>(count_) * static_cast<std::size_t>(token_bytes_));
  if (actual != checksum_)
    corrupt(file_.path(),
            detail::concat("the payload checksum is ", actual, " but the header says ", checksum_,
                           " (the tokens were modified or damaged)"));
}

uint32_t TokenFile::get(int64_t i) const {
  const unsigned char* p =
      payload_ + static_cast<std::size_t>(i) * static_cast<std::size_t>(token_bytes_);
  return token_bytes_ == 2 ? load_le16(p) : load_le32(p);
}

void TokenFile::read(int64_t first, int64_t n, int32_t* out) const {
  check_token_range(*this, first, n);
  const unsigned char* p =
      payload_ + static_cast<std::size_t>(first) * static_cast<std::size_t>(token_bytes_);
  if (token_bytes_ == 2) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(load_le16(p + 2 * i));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(load_le32(p + 4 * i));
  }
}

}  // namespace tessera::data
