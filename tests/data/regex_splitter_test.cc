// RegexSplitter (PCRE2) against Hugging Face's Split pre-tokenizer on Oniguruma: the pieces of
// GPT-2's, Llama 3's and Qwen2's patterns, of Llama 3's with possessive quantifiers and an
// atomic group, and of one where Oniguruma's Ruby syntax and Perl's differ, for every test text.
#include "tessera/data/regex_splitter.h"

#include <gtest/gtest.h>

#include "tessera/core/error.h"
#include "tessera/data/hf_tokenizer_json.h"
#include "tessera/data/oniguruma_syntax.h"
#include "tokenizer_fixtures.h"

namespace tessera::data {
namespace {

std::vector<std::string> strings(const std::vector<std::string_view>& pieces) {
  return {pieces.begin(), pieces.end()};
}

TEST(RegexSplitter, PiecesAreTheReferenceForEveryPatternAndText) {
  const auto& pretokenize = testing::tokenizer_expected().at("pretokenize");
  ASSERT_EQ(pretokenize.size(), 5u);
  const auto& texts = testing::tokenizer_reference("gpt2").at("cases");
  for (const auto& [name, p] : pretokenize.items()) {
    const RegexSplitter split(p.at("pattern").get<std::string>(), false, name);
    for (const auto& [text_name, pieces] : p.at("pieces").items()) {
      SCOPED_TRACE(name + " / " + text_name);
      const std::string text = texts.at(text_name).at("text");
      EXPECT_EQ(strings(split.split(text)), pieces.get<std::vector<std::string>>());
    }
  }
}

TEST(RegexSplitter, Gpt2PatternConstantIsTheFixturesPattern) {
  EXPECT_EQ(std::string(kGpt2Pattern),
            testing::tokenizer_expected()["pretokenize"]["gpt2"]["pattern"].get<std::string>());
}

TEST(RegexSplitter, UnicodeClassesCaseFoldingAndLookahead) {
  const std::string llama3 =
      testing::tokenizer_expected()["pretokenize"]["llama3"]["pattern"].get<std::string>();
  const RegexSplitter split(llama3, false, "llama3");
  // (?i:'s|...) folds case; \p{L} takes Cyrillic and CJK; \p{N}{1,3} cuts digits in threes;
  // \s+(?!\S) leaves the last space to the next word.
  EXPECT_EQ(strings(split.split("IT'S Привет 12345   x")),
            (std::vector<std::string>{"IT", "'S", " Привет", " ", "123", "45", "  ", " x"}));
}

TEST(RegexSplitter, EmptyMatchesCutTheTextAndLiteralsAreNotRegexes) {
  const RegexSplitter empty("x*", false, "test");
  EXPECT_EQ(strings(empty.split("abxxc")), (std::vector<std::string>{"a", "b", "xx", "c"}));
  const RegexSplitter literal("a.", true, "test");
  EXPECT_EQ(strings(literal.split("ba.ab")), (std::vector<std::string>{"b", "a.", "ab"}));
  EXPECT_TRUE(empty.split("").empty());
}

TEST(RegexSplitter, IllFormedUtf8IsAPieceOfItsOwnAndLongRunsWork) {
  const RegexSplitter split(std::string(kGpt2Pattern), false, "gpt2");
  EXPECT_EQ(strings(split.split("ab\xff\xfe"
                                "cd \xe4\xb8")),
            (std::vector<std::string>{"ab", "\xff\xfe", "cd", " ", "\xe4\xb8"}));
  // A megabyte of one class, then of spaces before a word (the lookahead backtracks once).
  const std::string letters(1 << 20, 'a');
  EXPECT_EQ(split.split(letters).size(), 1u);
  const std::string spaces = std::string(1 << 20, ' ') + "x";
  const auto pieces = split.split(spaces);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1], " x");
}

TEST(RegexSplitter, OnigurumaPatternsAreRewrittenWhereRubySyntaxDiffers) {
  EXPECT_EQ(oniguruma_to_pcre2(R"(\p{N}{1,3}+| ?[^\s\p{L}]++)"),
            R"((?:\p{N}{1,3})+| ?[^\s\p{L}]++)");
  EXPECT_EQ(oniguruma_to_pcre2(R"((ab){2}+x{3}?[\h\]]\h\H)"),
            R"((?:(ab){2})+x{3}?[0-9a-fA-F\]][0-9a-fA-F][^0-9a-fA-F])");
  EXPECT_EQ(oniguruma_to_pcre2(R"(\p{L}++|\s++$|a{,2}|{x)"), R"(\p{L}++|\s++$|a{,2}|{x)");
  // The possessive {1,3}+ of PCRE2 would cut 12345 into 123 and 45.
  const RegexSplitter digits(R"(\p{N}{1,3}+|\s+)", false, "test");
  EXPECT_EQ(strings(digits.split("12345 6")), (std::vector<std::string>{"12345", " ", "6"}));
  // $ before every newline: the two spaces end a line (with $ only at the end, one space would).
  const RegexSplitter lines(R"(\s+$|\S+|\s)", false, "test");
  EXPECT_EQ(strings(lines.split("a  \nb")), (std::vector<std::string>{"a", "  ", "\n", "b"}));
}

TEST(RegexSplitter, APatternThatDoesNotCompileIsAConfigErrorNamingIt) {
  try {
    RegexSplitter("a(b", false, "my.json: pre_tokenizer Split 0");
    FAIL() << "compiled";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "my.json: pre_tokenizer Split 0: the pattern 'a(b' does not compile at offset 3 "
              "(missing closing parenthesis)");
  }
}

}  // namespace
}  // namespace tessera::data
