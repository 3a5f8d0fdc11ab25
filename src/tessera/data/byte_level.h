// GPT-2's byte-level alphabet: each of the 256 bytes as one printable Unicode character (the
// printable Latin-1 bytes as themselves, the others as U+0100 onwards). Hugging Face's ByteLevel
// pre-tokenizer hands text to a BPE model in this form, and tokenizer.json writes its vocabulary
// and merges in it ("Ġthe" is " the"); tessera converts them back to bytes once, at load.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::data::byte_level {

// The character that stands for byte `b`.
char32_t byte_to_char(uint8_t b);
// The byte that `c` stands for; std::nullopt for a character outside the alphabet.
std::optional<uint8_t> char_to_byte(char32_t c);

// The bytes a vocabulary string (UTF-8 of alphabet characters) stands for; std::nullopt when it is
// not well-formed UTF-8 or holds a character outside the alphabet.
std::optional<std::string> to_bytes(std::string_view token);
// The vocabulary string of `bytes` (UTF-8 of alphabet characters).
std::string from_bytes(std::string_view bytes);

}  // namespace tessera::data::byte_level
