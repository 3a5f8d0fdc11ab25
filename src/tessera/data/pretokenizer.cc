#include "tessera/data/pretokenizer.h"

#include <algorithm>

namespace tessera::data {
namespace {

enum class ByteClass : unsigned char { kLetter, kDigit, kSpace, kOther };

constexpr ByteClass classify(unsigned char c) {
  if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return ByteClass::kLetter;
  if (c >= '0' && c <= '9') return ByteClass::kDigit;
  if (c == ' ' || (c >= '\t' && c <= '\r')) return ByteClass::kSpace;
  return ByteClass::kOther;
}

// Class of text[i], treating an apostrophe between two letters as a letter.
ByteClass class_at(std::string_view text, std::size_t i) {
  auto c = static_cast<unsigned char>(text[i]);
  if (c == '\'' && i > 0 && i + 1 < text.size() &&
      classify(static_cast<unsigned char>(text[i - 1])) == ByteClass::kLetter &&
      classify(static_cast<unsigned char>(text[i + 1])) == ByteClass::kLetter) {
    return ByteClass::kLetter;
  }
  return classify(c);
}

}  // namespace

namespace internal {

std::size_t chunk_length(std::string_view text, std::size_t pos) {
  const std::size_t n = text.size();
  const std::size_t limit = std::min(n, pos + kMaxChunkBytes);
  std::size_t i = pos;
  ByteClass cls = class_at(text, i);
  if (cls == ByteClass::kSpace) {
    // A single space directly followed by a non-space run belongs to that run.
    if (text[i] == ' ' && i + 1 < n && class_at(text, i + 1) != ByteClass::kSpace) {
      ++i;
      cls = class_at(text, i);
    } else {
      std::size_t j = i;
      while (j < limit && class_at(text, j) == ByteClass::kSpace) ++j;
      // Leave a trailing space to the following word, when one follows and the run is longer.
      if (j < n && j < limit && j - i > 1 && text[j - 1] == ' ') --j;
      return j - pos;
    }
  }
  while (i < limit && class_at(text, i) == cls) ++i;
  return i - pos;
}

}  // namespace internal

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> chunks;
  for_each_chunk(text, [&](std::string_view c) { chunks.push_back(c); });
  return chunks;
}

}  // namespace tessera::data
