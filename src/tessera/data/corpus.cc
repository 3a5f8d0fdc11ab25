#include "tessera/data/corpus.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/data/token_file.h"

namespace tessera::data {
namespace fs = std::filesystem;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool only_whitespace(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  });
}

bool is_separator_line(std::string_view line) {
  return line == "%" || line == "%\r";
}

constexpr std::string_view kAccepted =
    "--data accepts a UTF-8 text file, a directory of text files, a tessera token file, or a "
    "raw little-endian uint16 token file whose name ends in .bin (nanoGPT's train.bin)";

}  // namespace

DataFormat detect_data_format(const fs::path& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) {
    throw ConfigError(detail::concat("the data path ", path.string(), " does not exist; ",
                                     kAccepted, "; omit --data for the default corpus"));
  }
  if (fs::is_directory(st)) return DataFormat::kTextDirectory;
  if (!fs::is_regular_file(st)) {
    throw ConfigError(detail::concat("the data path ", path.string(),
                                     " is neither a regular file nor a directory; ", kAccepted));
  }
  if (has_token_file_magic(path)) return DataFormat::kTokenFile;
  if (ends_with(path.filename().string(), ".bin")) return DataFormat::kRawUint16;
  return DataFormat::kText;
}

std::vector<fs::path> list_text_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    throw ConfigError(
        detail::concat("could not list the directory ", dir.string(), ": ", ec.message()));
  }
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8"))
      continue;
    if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    throw ConfigError(detail::concat(
        "the directory ", dir.string(),
        " holds no text files (regular files, not hidden, not ending in .dat or .u8)"));
  }
  return files;
}

std::vector<fs::path> default_corpus_files(const fs::path& dir) {
  std::error_code ec;
  bool usable = fs::is_directory(dir, ec);
  std::vector<fs::path> files;
  if (usable) {
    try {
      files = list_text_files(dir);
    } catch (const ConfigError&) {
      usable = false;
    }
  }
  if (!usable) {
    throw ConfigError(detail::concat(
        "the default corpus is missing: ", dir.string(),
        " does not exist or holds no fortune files; install it with `apt-get install fortunes` "
        "(Debian/Ubuntu), or pass --data with a text file, a directory of text files, or a token "
        "file"));
  }
  return files;
}

std::vector<std::string> split_documents(std::string_view text) {
  std::vector<std::string> docs;
  // Is there any "%" line?
  bool fortune = false;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t eol = text.find('\n', pos);
    std::size_t end = eol == std::string_view::npos ? text.size() : eol;
    if (is_separator_line(text.substr(pos, end - pos))) {
      fortune = true;
      break;
    }
    pos = end + 1;
  }
  auto emit = [&](std::string_view doc) {
    if (!only_whitespace(doc)) docs.emplace_back(doc);
  };
  if (!fortune) {
    emit(text);
    return docs;
  }
  std::size_t doc_begin = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t eol = text.find('\n', pos);
    std::size_t end = eol == std::string_view::npos ? text.size() : eol;
    if (is_separator_line(text.substr(pos, end - pos))) {
      emit(text.substr(doc_begin, pos - doc_begin));
      doc_begin = eol == std::string_view::npos ? text.size() : eol + 1;
    }
    pos = end + 1;
  }
  if (doc_begin < text.size()) emit(text.substr(doc_begin));
  return docs;
}

TextCorpus read_text_corpus(std::span<const fs::path> files) {
  TextCorpus corpus;
  corpus.fingerprint = stable_hash("tessera-text-corpus-v1");
  for (const fs::path& file : files) {
    std::ifstream f(file, std::ios::binary);
    TESSERA_CHECK_AS(IoError, f.is_open(), "could not open the text file ", file.string(),
                     "; it does not exist or is not readable");
    std::ostringstream ss;
    ss << f.rdbuf();
    TESSERA_CHECK_AS(IoError, !f.bad(), "could not read the text file ", file.string());
    const std::string text = std::move(ss).str();
    const std::size_t nul = text.find('\0');
    TESSERA_CHECK_AS(ConfigError, nul == std::string::npos, "the file ", file.string(),
                     " holds a NUL byte at offset ", nul, ", so it is not text; ", kAccepted);
    for (std::string& doc : split_documents(text)) {
      corpus.bytes += doc.size();
      corpus.fingerprint = mix_stream(corpus.fingerprint, stable_hash(doc));
      corpus.documents.push_back(std::move(doc));
    }
    corpus.files.push_back(file);
  }
  TESSERA_CHECK_AS(ConfigError, !corpus.documents.empty(), "the text corpus (",
                   files.empty() ? std::string("no files") : files.front().string(),
                   files.size() > 1 ? " and others" : "", ") holds no text");
  return corpus;
}

}  // namespace tessera::data
