// UTF-8 helpers and the byte-level alphabet: the lossy repair is Python's (and so Hugging
// Face's) and GPT-2's bytes_to_unicode is reproduced.
#include "tessera/data/utf8.h"

#include <gtest/gtest.h>

#include "tessera/data/byte_level.h"

namespace tessera::data {
namespace {

TEST(Utf8, LossyRepairReplacesEachMaximalSubpart) {
  // Expected strings: Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(utf8::to_valid_lossy("ab"), "ab");
  EXPECT_EQ(utf8::to_valid_lossy("\xe4\xb8"), "\uFFFD");  // a truncated character: one
  EXPECT_EQ(utf8::to_valid_lossy("\xe4\xb8"
                                 "a"),
            "\uFFFD"
            "a");                                               // maximal subpart
  EXPECT_EQ(utf8::to_valid_lossy("\x80\x80"), "\uFFFD\uFFFD");  // each stray continuation
  EXPECT_EQ(utf8::to_valid_lossy("\xc0\xaf"), "\uFFFD\uFFFD");  // overlong: C0 is never valid
  EXPECT_EQ(utf8::to_valid_lossy("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD");            // a surrogate
  EXPECT_EQ(utf8::to_valid_lossy("\xf4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // > U+10FFFF
  EXPECT_EQ(utf8::to_valid_lossy("\xf0\x9f\x98"), "\uFFFD");
  EXPECT_EQ(utf8::to_valid_lossy("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_TRUE(utf8::is_valid("Grüße, 世界 🙂"));
  EXPECT_FALSE(utf8::is_valid("\xff"));
}

TEST(ByteLevel, AlphabetIsGpt2s) {
  EXPECT_EQ(byte_level::byte_to_char(' '), U'Ġ');
  EXPECT_EQ(byte_level::byte_to_char('\n'), U'Ċ');
  EXPECT_EQ(byte_level::byte_to_char('a'), U'a');
  EXPECT_EQ(byte_level::byte_to_char(0), U'Ā');
  EXPECT_EQ(byte_level::byte_to_char(0xAD), U'\u0143');  // the last of the 68 moved bytes
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    EXPECT_EQ(byte_level::to_bytes(byte_level::from_bytes(one)), one) << b;
  }
  EXPECT_EQ(byte_level::from_bytes(" the"), "Ġthe");
  EXPECT_FALSE(byte_level::to_bytes("a b").has_value());  // a space is not in the alphabet
}

}  // namespace
}  // namespace tessera::data
