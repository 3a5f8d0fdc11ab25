#include "tessera/data/pretokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace tessera::data {
namespace {

std::vector<std::string> chunks(std::string_view s) {
  std::vector<std::string> out;
  for (auto c : pretokenize(s)) out.emplace_back(c);
  return out;
}

TEST(Pretokenizer, SplitsWordsWithLeadingSpace) {
  EXPECT_EQ(chunks("Hello world, it's 2024!"),
            (std::vector<std::string>{"Hello", " world", ",", " it's", " 2024", "!"}));
}

TEST(Pretokenizer, WhitespaceRunsLeaveLastSpaceToNextWord) {
  EXPECT_EQ(chunks("a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  EXPECT_EQ(chunks("a\n\nb"), (std::vector<std::string>{"a", "\n\n", "b"}));
  EXPECT_EQ(chunks("end  "), (std::vector<std::string>{"end", "  "}));
  EXPECT_EQ(chunks(" --x"), (std::vector<std::string>{" --", "x"}));
}

TEST(Pretokenizer, Utf8WordsStayTogether) {
  EXPECT_EQ(chunks("caf\xc3\xa9 na\xc3\xafve"),
            (std::vector<std::string>{"caf\xc3\xa9", " na\xc3\xafve"}));
}

TEST(Pretokenizer, ConcatenationIsIdentityAndChunksAreBounded) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::string s(static_cast<std::size_t>(rng() % 2000), '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? 'a' : rng() % 256);
    std::string joined;
    for (auto c : pretokenize(s)) {
      ASSERT_FALSE(c.empty());
      ASSERT_LE(c.size(), kMaxChunkBytes);
      joined += c;
    }
    ASSERT_EQ(joined, s);
  }
  std::string long_word(1000, 'x');
  EXPECT_EQ(pretokenize(long_word).size(), (1000 + kMaxChunkBytes - 1) / kMaxChunkBytes);
}

}  // namespace
}  // namespace tessera::data
