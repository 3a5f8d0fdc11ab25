// Data preparation with a tokenizer of another format (a Hugging Face tokenizer.json, a
// SentencePiece tokenizer.model, or a folder holding one): the text is encoded document by
// document with that tokenizer, each document followed by its EOS, and the token ids are those the
// tokenizer gives; the tokenizer of the result is the given one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "tessera/data/load_tokenizer.h"
#include "tessera/data/prepare.h"
#include "tokenizer_fixtures.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

fs::path corpus(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("tessera_prepare_external_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "corpus.txt") << "The first document, with numbers 1234.\n%\n"
                                    << "Der zweite Text: schön.\n%\n";
  return dir;
}

std::vector<uint32_t> read_all(const TokenSource& t) {
  std::vector<uint32_t> v;
  for (int64_t i = 0; i < t.size(); ++i) v.push_back(t.get(i));
  return v;
}

class PrepareWithExternalTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(PrepareWithExternalTokenizer, EncodesEachDocumentThenItsEos) {
  const fs::path file = testing::tokenizer_fixture_file(GetParam());
  const fs::path dir = corpus(GetParam());
  DataOptions o;
  o.data = dir / "corpus.txt";
  o.tokenizer = file;
  o.cache_dir = dir / "cache";
  const PreparedData p = prepare_data(o);
  ASSERT_NE(p.external, nullptr);
  EXPECT_FALSE(p.tokenizer.has_value());
  EXPECT_EQ(p.external_source, file);
  EXPECT_EQ(p.text_tokenizer(), p.external);
  const std::unique_ptr<Tokenizer> t = load_tokenizer(file);
  EXPECT_EQ(p.vocab_size, t->vocab_size());
  std::vector<uint32_t> want;
  for (const char* doc :
       {"The first document, with numbers 1234.\n", "Der zweite Text: schön.\n"}) {
    const std::vector<uint32_t> d = t->encode(doc);
    want.insert(want.end(), d.begin(), d.end());
    if (t->special_tokens().eos) want.push_back(*t->special_tokens().eos);
  }
  EXPECT_EQ(read_all(*p.tokens), want);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrepareWithExternalTokenizer,
                         ::testing::Values("llama3", "qwen2", "sp_bpe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tessera::data
