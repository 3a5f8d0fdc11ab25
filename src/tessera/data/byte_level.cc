#include "tessera/data/byte_level.h"

#include <array>

#include "tessera/data/utf8.h"

namespace tessera::data::byte_level {
namespace {

struct Alphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // every character of the alphabet is < U+0144

  Alphabet() {
    to_byte.fill(-1);
    // The bytes that are printable in Latin-1 stand for themselves; the other 68 take U+0100,
    // U+0101, ... in byte order (GPT-2's bytes_to_unicode).
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[static_cast<std::size_t>(b)]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_to_char(uint8_t b) {
  return alphabet().to_char[b];
}

std::optional<uint8_t> char_to_byte(char32_t c) {
  const auto& a = alphabet();
  if (c >= a.to_byte.size() || a.to_byte[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(a.to_byte[c]);
}

std::optional<std::string> to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (std::size_t pos = 0; pos < token.size();) {
    const utf8::Decoded d = utf8::decode_at(token, pos);
    if (!d.valid) return std::nullopt;
    const auto b = char_to_byte(d.code_point);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += d.length;
  }
  return out;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append(out, byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

}  // namespace tessera::data::byte_level
