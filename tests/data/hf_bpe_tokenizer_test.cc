// HfBpeTokenizer against Hugging Face `tokenizers` on the fixtures (GPT-2's ByteLevel with "a b"
// merges, Llama 3's Split regex with ignore_merges and a <|begin_of_text|> template, Qwen2's
// Split regex), and the cases the reference cannot give (text that is not UTF-8).
#include "tessera/data/hf_bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>

#include "tessera/core/error.h"
#include "tessera/data/byte_level.h"
#include "tessera/data/utf8.h"
#include "tokenizer_fixtures.h"

namespace tessera::data {
namespace {

using testing::ids_of;
using testing::tokenizer_fixture_file;
using testing::tokenizer_reference;

class HfFixture : public ::testing::TestWithParam<std::string> {
 protected:
  const HfBpeTokenizer& tok() {
    static std::map<std::string, HfBpeTokenizer> loaded;
    auto it = loaded.find(GetParam());
    if (it == loaded.end())
      it = loaded.emplace(GetParam(), HfBpeTokenizer::load(tokenizer_fixture_file(GetParam())))
               .first;
    return it->second;
  }
  const nlohmann::json& ref() { return tokenizer_reference(GetParam()); }
};

TEST_P(HfFixture, EncodesAndDecodesEveryTextAsTheReference) {
  const auto& cases = ref().at("cases");
  ASSERT_GE(cases.size(), 15u);
  for (const auto& [name, c] : cases.items()) {
    SCOPED_TRACE(name);
    const std::string text = c.at("text");
    const auto ids = tok().encode(text);
    EXPECT_EQ(ids, ids_of(c.at("ids")));
    const auto with_special = tok().encode_with_special_tokens(text);
    EXPECT_EQ(with_special, ids_of(c.at("ids_with_special")));
    EXPECT_EQ(tok().decode(ids), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok().decode(with_special), c.at("decoded_with_special").get<std::string>());
    EXPECT_EQ(tok().decode(ids), text);  // the round trip
  }
}

TEST_P(HfFixture, VocabularySizeAndSpecialTokensAreTheReferences) {
  EXPECT_EQ(tok().vocab_size(), ref().at("vocab_size").get<int>());
  for (const auto& [content, id] : ref().at("special_tokens").items()) {
    EXPECT_EQ(tok().token_to_id(content), id.get<uint32_t>()) << content;
    // A special token decodes to its text and, alone in a text, encodes to its id.
    EXPECT_EQ(tok().decode(std::vector<uint32_t>{id.get<uint32_t>()}), content);
    EXPECT_EQ(tok().encode(content), std::vector<uint32_t>{id.get<uint32_t>()});
  }
  const auto special = tok().special_tokens();
  if (ref().at("bos").is_null()) {
    EXPECT_FALSE(special.bos.has_value());
  } else {
    EXPECT_EQ(special.bos, ref().at("bos").get<uint32_t>());
  }
  ASSERT_TRUE(special.eos.has_value());  // every fixture has an end-of-text token
  const std::string eos_text = tok().decode(std::vector<uint32_t>{*special.eos});
  EXPECT_TRUE(eos_text == "<|endoftext|>" || eos_text == "<|end_of_text|>") << eos_text;
}

// Hugging Face decodes a token holding part of a character to U+FFFD; tessera gives its bytes,
// so the decodes of consecutive ids concatenate to the text. Repaired the same way, they agree.
TEST_P(HfFixture, SingleIdDecodesAreTheReferenceOnceRepairedAndConcatenateToTheText) {
  const auto& c = ref().at("cases").at("multilingual");
  const auto ids = ids_of(c.at("ids"));
  const auto& single = ref().at("single_id_decodes");
  ASSERT_EQ(single.size(), ids.size());
  std::string joined;
  int partial = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string mine = tok().decode(std::span(&ids[i], 1));
    EXPECT_EQ(utf8::to_valid_lossy(mine), single[i].get<std::string>()) << "id " << ids[i];
    partial += utf8::is_valid(mine) ? 0 : 1;
    joined += mine;
  }
  EXPECT_GT(partial, 0) << "the text should have a character split across tokens";
  EXPECT_EQ(joined, c.at("text").get<std::string>());
}

TEST_P(HfFixture, TextThatIsNotUtf8IsEncodedByteForByte) {
  // Ill-formed bytes match no part of the regex, so they are pieces of their own: the ids are
  // those of the well-formed parts with the bytes' ids between them.
  const std::string bad = "\xff\xfe";
  const auto byte_id = [&](unsigned char b) {
    return *tok().token_to_id(byte_level::from_bytes(std::string(1, static_cast<char>(b))));
  };
  const auto ids = tok().encode("Hello" + bad + "world");
  std::vector<uint32_t> expected = tok().encode("Hello");
  expected.push_back(byte_id(0xff));
  expected.push_back(byte_id(0xfe));
  for (uint32_t id : tok().encode("world")) expected.push_back(id);
  EXPECT_EQ(ids, expected);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 50; ++trial) {
    std::string s;
    for (int i = 0; i < 200; ++i) s.push_back(static_cast<char>(byte(rng)));
    s += ref().at("cases").at("multilingual").at("text").get<std::string>().substr(0, 100);
    EXPECT_EQ(tok().decode(tok().encode(s)), s);
  }
  // A truncated character at the end and a lone continuation byte.
  for (std::string s : {std::string("caf\xc3"), std::string("\x80 abc"), std::string("\xe4\xb8")})
    EXPECT_EQ(tok().decode(tok().encode(s)), s);
}

TEST_P(HfFixture, EncodingIsThreadSafe) {
  const std::string text = ref().at("cases").at("multilingual").at("text");
  const auto expected = ids_of(ref().at("cases").at("multilingual").at("ids"));
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) ok[t] += tok().encode(text) == expected ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 20);
}

TEST_P(HfFixture, DecodeRejectsIdsOutsideTheVocabulary) {
  const std::vector<uint32_t> ids{0, static_cast<uint32_t>(tok().vocab_size())};
  try {
    tok().decode(ids);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("token id " + std::to_string(tok().vocab_size())),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFixture, ::testing::Values("gpt2", "llama3", "qwen2"));

TEST(HfBpeTokenizer, Llama3FixtureAddsBeginOfTextAndIgnoresMerges) {
  const auto tok = HfBpeTokenizer::load(tokenizer_fixture_file("llama3"));
  EXPECT_EQ(tok.template_prefix(), std::vector<uint32_t>{*tok.token_to_id("<|begin_of_text|>")});
  EXPECT_TRUE(tok.template_suffix().empty());
  const auto ids = tok.encode_with_special_tokens("");
  EXPECT_EQ(ids, std::vector<uint32_t>{*tok.token_to_id("<|begin_of_text|>")});
}

}  // namespace
}  // namespace tessera::data
