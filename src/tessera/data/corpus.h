// Text corpora: which files a --data path names, how text is cut into documents, and the
// default corpus (Debian's `fortunes` package).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// Where Debian's `fortunes` package installs its English fortune files.
inline constexpr std::string_view kDefaultCorpusDir = "/usr/share/games/fortunes";

// What a --data path holds.
enum class DataFormat {
  kTextDirectory,  // a directory of UTF-8 text files (see list_text_files)
  kText,           // one UTF-8 text file
  kTokenFile,      // a tessera token file (starts with "TSRTOK01")
  kRawUint16,      // a headerless little-endian uint16 token file, name ending in ".bin"
};

// Decides by content and name: a directory; a file starting with the token-file magic; a file
// whose name ends in ".bin"; otherwise text. Throws ConfigError naming the path when it does not
// exist.
DataFormat detect_data_format(const std::filesystem::path& path);

// The text files of a directory, sorted by name: regular files directly inside it (not in
// subdirectories, not symbolic links), skipping hidden files and the index files of `strfile`
// (names ending in ".dat" or ".u8"). Throws ConfigError when there are none.
std::vector<std::filesystem::path> list_text_files(const std::filesystem::path& dir);

// The default corpus: list_text_files(kDefaultCorpusDir) (43 files, 15217 documents, 2.5 MB
// with Debian's fortunes 1:1.99.1). Throws ConfigError naming the directory and saying
// `apt-get install fortunes` when it is missing or empty.
std::vector<std::filesystem::path> default_corpus_files(
    const std::filesystem::path& dir = std::filesystem::path(kDefaultCorpusDir));

// Cuts a text into documents. A text holding at least one line that is exactly "%" (the
// `fortune` format; a trailing "\r" is allowed) is split at those lines, each entry keeping its
// own final newline; otherwise the whole text is one document. Documents that are empty or only
// whitespace are dropped.
std::vector<std::string> split_documents(std::string_view text);

struct TextCorpus {
  std::vector<std::string> documents;        // in file order, then order within the file
  std::vector<std::filesystem::path> files;  // the files read
  uint64_t bytes = 0;                        // total bytes of the documents
  uint64_t fingerprint = 0;                  // hash of the documents and their boundaries
};

// Reads the files and splits each with split_documents(). Throws IoError naming a file that
// cannot be read, ConfigError for a file holding NUL bytes (binary, not text) and for a corpus
// without any text.
TextCorpus read_text_corpus(std::span<const std::filesystem::path> files);

}  // namespace tessera::data
