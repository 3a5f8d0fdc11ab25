#include "tessera/data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "tessera/core/error.h"
#include "test_util.h"

namespace tessera::data {
namespace {

using testing::small_corpus;
using testing::TempDir;
using testing::write_file;

const BpeTokenizer& trained() {
  static const BpeTokenizer tok = BpeTokenizer::train(small_corpus(), {.vocab_size = 400});
  return tok;
}

TEST(BpeTokenizer, ByteTokenizerRoundTripsRandomBytes) {
  BpeTokenizer bytes;
  EXPECT_EQ(bytes.vocab_size(), 256);
  std::string s;
  for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  auto ids = bytes.encode(s);
  ASSERT_EQ(ids.size(), 256u);
  EXPECT_EQ(bytes.decode(ids), s);
}

TEST(BpeTokenizer, TrainingReachesVocabSizeAndCompresses) {
  const BpeTokenizer& tok = trained();
  EXPECT_EQ(tok.vocab_size(), 400);
  ASSERT_TRUE(tok.end_of_text().has_value());
  EXPECT_EQ(*tok.end_of_text(), 399u);
  EXPECT_EQ(tok.merges().size(), 400u - 256u - 1u);
  const std::string text = small_corpus();
  auto ids = tok.encode(text);
  EXPECT_LT(ids.size() * 3, text.size()) << "expected more than 3 bytes per token";
  EXPECT_EQ(tok.decode(ids), text);
  for (uint32_t id : ids) EXPECT_LT(id, 399u);  // encode never emits end-of-text
}

TEST(BpeTokenizer, TrainingIsDeterministic) {
  auto a = BpeTokenizer::train(small_corpus(), {.vocab_size = 300, .end_of_text = false});
  auto b = BpeTokenizer::train(small_corpus(), {.vocab_size = 300, .end_of_text = false});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.vocab_size(), 300);
  EXPECT_FALSE(a.end_of_text().has_value());
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
}

TEST(BpeTokenizer, RoundTripsRandomBytesAndUtf8) {
  const BpeTokenizer& tok = trained();
  std::mt19937 rng(42);
  for (int trial = 0; trial < 100; ++trial) {
    std::string s(static_cast<std::size_t>(rng() % 500), '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);  // includes invalid UTF-8 and NUL
    ASSERT_EQ(tok.decode(tok.encode(s)), s);
  }
  const std::string utf8 =
      "Gr\xc3\xbc\xc3\x9f"
      "e aus K\xc3\xb6ln \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
      "\xf0\x9f\x98\x80 the quick brown fox <|endoftext|>\n";
  EXPECT_EQ(tok.decode(tok.encode(utf8)), utf8);
  EXPECT_EQ(tok.decode(tok.encode("")), "");
}

TEST(BpeTokenizer, EncodeDocumentsAppendsEndOfText) {
  const BpeTokenizer& tok = trained();
  std::vector<std::string> docs{"To be, or not to be.\n", "The quick brown fox.\n"};
  auto ids = tok.encode_documents(docs);
  auto first = tok.encode(docs[0]);
  ASSERT_GT(ids.size(), first.size());
  EXPECT_EQ(std::vector<uint32_t>(ids.begin(), ids.begin() + static_cast<long>(first.size())),
            first);
  EXPECT_EQ(ids[first.size()], *tok.end_of_text());
  EXPECT_EQ(ids.back(), *tok.end_of_text());
  EXPECT_EQ(tok.decode(ids), docs[0] + "<|endoftext|>" + docs[1] + "<|endoftext|>");
}

TEST(BpeTokenizer, DecodeRejectsOutOfRangeIds) {
  const BpeTokenizer& tok = trained();
  std::vector<uint32_t> bad{65, 400};
  EXPECT_THROW(tok.decode(bad), ConfigError);
}

TEST(BpeTokenizer, SaveLoadRoundTrip) {
  TempDir dir;
  const BpeTokenizer& tok = trained();
  tok.save(dir / "tokenizer.json");
  BpeTokenizer back = BpeTokenizer::load(dir / "tokenizer.json");
  EXPECT_EQ(back, tok);
  EXPECT_EQ(back.vocab_size(), tok.vocab_size());
  EXPECT_EQ(back.encode(small_corpus()), tok.encode(small_corpus()));
}

TEST(BpeTokenizer, VocabTooSmallOrCorpusTooSmallIsConfigError) {
  EXPECT_THROW(BpeTokenizer::train("abc", {.vocab_size = 100}), ConfigError);
  try {
    BpeTokenizer::train("abcabc", {.vocab_size = 1000});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos) << e.what();
  }
}

void expect_malformed(std::string_view json, std::string_view needle) {
  TempDir dir;
  const auto path = dir / "tokenizer.json";
  write_file(path, json);
  try {
    BpeTokenizer::load(path);
    FAIL() << "expected IoError for " << json;
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(BpeTokenizer, MalformedFilesGiveIoErrorNamingTheFile) {
  expect_malformed("{not json", "not valid JSON");
  expect_malformed("[1,2]", "not a JSON object");
  expect_malformed(R"({"format":"tessera-bpe","version":1,"vocab_size":257,"end_of_text":256})",
                   "\"merges\" is missing");
  expect_malformed(
      R"({"format":"gpt2","version":1,"vocab_size":256,"end_of_text":null,"merges":[]})",
      "\"format\"");
  expect_malformed(
      R"({"format":"tessera-bpe","version":9,"vocab_size":256,"end_of_text":null,"merges":[]})",
      "version");
  expect_malformed(
      R"({"format":"tessera-bpe","version":1,"vocab_size":258,"end_of_text":null,"merges":[[1,300]]})",
      "merge 0");
  expect_malformed(
      R"({"format":"tessera-bpe","version":1,"vocab_size":258,"end_of_text":null,"merges":[[1,"a"]]})",
      "merge 0");
  expect_malformed(
      R"({"format":"tessera-bpe","version":1,"vocab_size":999,"end_of_text":null,"merges":[[1,2]]})",
      "vocab_size");
  expect_malformed(
      R"({"format":"tessera-bpe","version":1,"vocab_size":258,"end_of_text":5,"merges":[[1,2]]})",
      "end_of_text");
  expect_malformed(
      R"({"format":"tessera-bpe","version":1,"vocab_size":258,"end_of_text":null,"merges":[[1,2],[1,2]]})",
      "repeats");
}

TEST(BpeTokenizer, MissingFileIsIoError) {
  EXPECT_THROW(BpeTokenizer::load("/nonexistent/tokenizer.json"), IoError);
}

}  // namespace
}  // namespace tessera::data
