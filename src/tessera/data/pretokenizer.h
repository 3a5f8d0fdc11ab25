// Pre-tokenisation for byte-level BPE: cuts text into chunks ("words") so that BPE merges never
// cross a chunk boundary. Written for tessera; GPT-2-like in spirit, ASCII-class based.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace tessera::data {

// Longest chunk pretokenize() emits; longer runs are cut into pieces of at most this many bytes
// (bounds the cost of encoding pathological input such as a megabyte without spaces).
inline constexpr std::size_t kMaxChunkBytes = 128;

// Splits `text` into consecutive, non-empty chunks whose concatenation is exactly `text`.
// Byte classes: letters (A-Z, a-z and every byte >= 0x80, so UTF-8 words stay together),
// digits (0-9), whitespace (space, \t, \n, \v, \f, \r) and other (punctuation, control bytes).
// Rules, applied left to right:
//   * a run of letters, a run of digits or a run of "other" bytes is one chunk, and may start
//     with the single space that precedes it (" hello", " 42", " --");
//   * an apostrophe between two letters is a letter, so "don't" and "it's" stay one chunk;
//   * a run of whitespace is one chunk, except that its last space is left to the next chunk
//     when a letter, digit or other run follows ("a  b" -> "a", " ", " b").
// Any byte string is accepted, including invalid UTF-8 and NUL bytes.
std::vector<std::string_view> pretokenize(std::string_view text);

// Calls fn(chunk) for each chunk of pretokenize(text) without building a vector.
template <typename Fn>
void for_each_chunk(std::string_view text, Fn&& fn);

namespace internal {
// Length of the chunk that starts at text[pos] (pos < text.size()).
std::size_t chunk_length(std::string_view text, std::size_t pos);
}  // namespace internal

template <typename Fn>
void for_each_chunk(std::string_view text, Fn&& fn) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t n = internal::chunk_length(text, pos);
    fn(text.substr(pos, n));
    pos += n;
  }
}

}  // namespace tessera::data
