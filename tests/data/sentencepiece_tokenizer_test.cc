// SentencePieceTokenizer (Debian's libsentencepiece) against Python's sentencepiece on the
// fixtures: a Llama 2-style BPE with byte fallback and a unigram model with NFKC normalisation.
#include "tessera/data/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "tessera/core/error.h"
#include "test_util.h"
#include "tokenizer_fixtures.h"

namespace tessera::data {
namespace {

using testing::ids_of;
using testing::tokenizer_fixture_file;
using testing::tokenizer_reference;

class SpFixture : public ::testing::TestWithParam<std::string> {
 protected:
  const SentencePieceTokenizer& tok() {
    static std::map<std::string, SentencePieceTokenizer> loaded;
    auto it = loaded.find(GetParam());
    if (it == loaded.end())
      it =
          loaded
              .emplace(GetParam(), SentencePieceTokenizer::load(tokenizer_fixture_file(GetParam())))
              .first;
    return it->second;
  }
  const nlohmann::json& ref() { return tokenizer_reference(GetParam()); }
};

TEST_P(SpFixture, EncodesAndDecodesEveryTextAsTheReference) {
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
  }
  const auto& single = ref().at("single_id_decodes");
  const auto ids = ids_of(cases.at("multilingual").at("ids"));
  ASSERT_EQ(single.size(), ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(tok().decode(std::span(&ids[i], 1)), single[i].get<std::string>()) << ids[i];
}

TEST_P(SpFixture, VocabularySizeAndSpecialTokensAreTheReferences) {
  EXPECT_EQ(tok().vocab_size(), ref().at("vocab_size").get<int>());
  EXPECT_EQ(tok().special_tokens().bos, ref().at("bos").get<uint32_t>());
  EXPECT_EQ(tok().special_tokens().eos, ref().at("eos").get<uint32_t>());
  EXPECT_EQ(tok().id_to_piece(*tok().special_tokens().bos), "<s>");
  EXPECT_EQ(tok().id_to_piece(*tok().special_tokens().eos), "</s>");
  EXPECT_THROW(tok().decode(std::vector<uint32_t>{static_cast<uint32_t>(tok().vocab_size())}),
               ConfigError);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpFixture, ::testing::Values("sp_bpe", "sp_unigram"));

TEST(SentencePieceTokenizer, LlamaStyleBpeRoundTripsAndFallsBackToBytes) {
  const auto tok = SentencePieceTokenizer::load(tokenizer_fixture_file("sp_bpe"));
  const auto& cases = tokenizer_reference("sp_bpe").at("cases");
  for (const auto& [name, c] : cases.items())
    EXPECT_EQ(tok.decode(tok.encode(c.at("text").get<std::string>())), c.at("text")) << name;
  // Characters the model has never seen become their UTF-8 bytes.
  const auto ids = tok.encode("ꙮ");
  ASSERT_EQ(ids.size(), 4u);  // "▁" and three byte pieces
  EXPECT_EQ(tok.id_to_piece(ids[1]), "<0xEA>");
}

TEST(SentencePieceTokenizer, IllFormedUtf8IsReadAsTheReplacementCharacter) {
  const auto tok = SentencePieceTokenizer::load(tokenizer_fixture_file("sp_bpe"));
  EXPECT_EQ(tok.encode("ab\xff"
                       "cd"),
            tok.encode("ab\uFFFD"
                       "cd"));
  EXPECT_EQ(tok.decode(tok.encode("ab\xff"
                                  "cd")),
            "ab\uFFFD"
            "cd");
}

TEST(SentencePieceTokenizer, CorruptOrTruncatedFilesAreIoErrorsNamingThem) {
  testing::TempDir dir;
  testing::write_file(dir / "junk.model", "this is not a protobuf");
  EXPECT_THROW(SentencePieceTokenizer::load(dir / "junk.model"), IoError);
  const std::string bytes = testing::read_file(tokenizer_fixture_file("sp_bpe"));
  testing::write_file(dir / "cut.model", bytes.substr(0, bytes.size() / 2));
  try {
    SentencePieceTokenizer::load(dir / "cut.model");
    FAIL() << "a truncated model loaded";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()).find((dir / "cut.model").string() + ": not a SentencePiece"),
              0u)
        << e.what();
  }
  EXPECT_THROW(SentencePieceTokenizer::load(dir / "missing.model"), IoError);
}

}  // namespace
}  // namespace tessera::data
