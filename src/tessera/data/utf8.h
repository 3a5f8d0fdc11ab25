// UTF-8 for the tokenizers: the well-formed sequence at a position, appending a code point, and
// the lossy repair that replaces ill-formed bytes by U+FFFD the way Python's and Rust's decoders
// (and so Hugging Face's decode) do, one U+FFFD per maximal subpart (Unicode 15, section 3.9).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera::data::utf8 {

// A code point read from text: `length` bytes; `valid` false for an ill-formed sequence, whose
// `length` is then its maximal subpart (at least 1 byte) and `code_point` is U+FFFD.
struct Decoded {
  char32_t code_point;
  std::size_t length;
  bool valid;
};

// The sequence at text[pos] (pos < text.size()).
Decoded decode_at(std::string_view text, std::size_t pos);

// Whether `text` is well-formed UTF-8.
bool is_valid(std::string_view text);

// Appends the UTF-8 bytes of `cp` (a Unicode scalar value).
void append(std::string& out, char32_t cp);

// `text` with every ill-formed sequence replaced by U+FFFD (one per maximal subpart).
std::string to_valid_lossy(std::string_view text);

}  // namespace tessera::data::utf8
