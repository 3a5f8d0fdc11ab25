#include "tessera/data/corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "tessera/core/error.h"
#include "tessera/data/prepare.h"
#include "tessera/data/token_file.h"
#include "test_util.h"

namespace tessera::data {
namespace {

using testing::small_corpus;
using testing::TempDir;
using testing::write_file;

TEST(Corpus, SplitsFortuneFilesOnPercentLines) {
  auto docs = split_documents("First fortune.\n%\nSecond\n  -- someone\n%\n%\nThird\n%\n");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "First fortune.\n");
  EXPECT_EQ(docs[1], "Second\n  -- someone\n");
  EXPECT_EQ(docs[2], "Third\n");
  // No "%" line: the whole text is one document; "50%" lines do not count.
  docs = split_documents("A line with 50%\n%not a separator\n");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_TRUE(split_documents("  \n\n").empty());
  docs = split_documents("dos\r\n%\r\nline\r\n");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1], "line\r\n");
}

TEST(Corpus, DetectsFormats) {
  TempDir dir;
  write_file(dir / "a.txt", "hello\n");
  write_file(dir / "train.bin", std::string(4, '\0'));
  write_token_file(dir / "tokens.bin", std::vector<uint32_t>{1, 2}, 256);  // magic beats name
  EXPECT_EQ(detect_data_format(dir.path()), DataFormat::kTextDirectory);
  EXPECT_EQ(detect_data_format(dir / "a.txt"), DataFormat::kText);
  EXPECT_EQ(detect_data_format(dir / "train.bin"), DataFormat::kRawUint16);
  EXPECT_EQ(detect_data_format(dir / "tokens.bin"), DataFormat::kTokenFile);
  try {
    detect_data_format(dir / "nope.txt");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.txt"), std::string::npos) << e.what();
  }
}

TEST(Corpus, ListsTextFilesSortedSkippingIndexFiles) {
  TempDir dir;
  write_file(dir / "b", "b\n");
  write_file(dir / "a", "a\n");
  write_file(dir / "a.dat", "index");
  write_file(dir / ".hidden", "x");
  std::filesystem::create_symlink(dir / "a", dir / "a.u8");
  std::filesystem::create_symlink(dir / "a", dir / "link");
  std::filesystem::create_directories(dir / "off");
  write_file(dir / "off" / "c", "c\n");
  auto files = list_text_files(dir.path());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].filename(), "a");
  EXPECT_EQ(files[1].filename(), "b");
}

TEST(Corpus, MissingDefaultCorpusSaysHowToInstall) {
  try {
    default_corpus_files("/nonexistent/fortunes");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("apt-get install fortunes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("/nonexistent/fortunes"), std::string::npos) << msg;
  }
}

TEST(Corpus, DefaultCorpusIsFound) {
  if (!std::filesystem::is_directory(kDefaultCorpusDir)) GTEST_SKIP() << "fortunes not installed";
  auto files = default_corpus_files();
  ASSERT_GE(files.size(), 3u);
  bool has_fortunes = false, has_literature = false;
  for (const auto& f : files) {
    EXPECT_NE(f.extension(), ".dat");
    EXPECT_NE(f.extension(), ".u8");
    has_fortunes |= f.filename() == "fortunes";
    has_literature |= f.filename() == "literature";
  }
  EXPECT_TRUE(has_fortunes);
  EXPECT_TRUE(has_literature);
  std::vector<std::filesystem::path> one{kDefaultCorpusDir / std::filesystem::path("riddles")};
  TextCorpus c = read_text_corpus(one);
  EXPECT_GT(c.documents.size(), 50u);
}

TEST(Corpus, FortuneFilesTrainAndRoundTrip) {
  if (!std::filesystem::is_directory(kDefaultCorpusDir)) GTEST_SKIP() << "fortunes not installed";
  const std::filesystem::path dir(kDefaultCorpusDir);
  std::vector<std::filesystem::path> files{dir / "riddles", dir / "literature"};
  TextCorpus c = read_text_corpus(files);
  BpeTokenizer tok = BpeTokenizer::train(c.documents, {.vocab_size = 1024});
  EXPECT_EQ(tok.vocab_size(), 1024);
  std::vector<uint32_t> ids = tok.encode_documents(c.documents);
  EXPECT_LT(ids.size() * 2, c.bytes);  // more than 2 bytes per token
  std::string joined;
  for (const auto& d : c.documents) joined += d + "<|endoftext|>";
  EXPECT_EQ(tok.decode(ids), joined);
}

TEST(Corpus, BinaryFileIsRejected) {
  TempDir dir;
  write_file(dir / "x.txt", std::string("ab\0cd", 5));
  std::vector<std::filesystem::path> files{dir / "x.txt"};
  EXPECT_THROW(read_text_corpus(files), ConfigError);
}

TEST(Prepare, TextIsTokenizedAndCached) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 4; ++i) text += small_corpus() + "%\n";
  write_file(dir / "corpus.txt", text);
  DataOptions o{.data = dir / "corpus.txt", .vocab_size = 300, .cache_dir = dir / "cache"};
  PreparedData first = prepare_data(o);
  EXPECT_FALSE(first.reused_cache);
  EXPECT_EQ(first.vocab_size, 300);
  EXPECT_EQ(first.documents, 4);
  ASSERT_TRUE(first.tokenizer.has_value());
  EXPECT_TRUE(std::filesystem::exists(first.cache_entry / "tokenizer.json"));
  EXPECT_TRUE(std::filesystem::exists(first.cache_entry / "tokens.tsrtok"));

  PreparedData second = prepare_data(o);
  EXPECT_TRUE(second.reused_cache);
  EXPECT_EQ(second.cache_entry, first.cache_entry);
  ASSERT_EQ(second.tokens->size(), first.tokens->size());
  for (int64_t i = 0; i < first.tokens->size(); ++i)
    ASSERT_EQ(second.tokens->get(i), first.tokens->get(i));
  EXPECT_EQ(*second.tokenizer, *first.tokenizer);

  // A different vocabulary is another cache entry.
  o.vocab_size = 280;
  PreparedData third = prepare_data(o);
  EXPECT_FALSE(third.reused_cache);
  EXPECT_NE(third.cache_entry, first.cache_entry);

  // An existing tokenizer is used as is (no training), and the token file reads back with it.
  DataOptions with_tok{.data = dir / "corpus.txt",
                       .tokenizer = first.cache_entry / "tokenizer.json"};
  PreparedData fourth = prepare_data(with_tok);
  EXPECT_EQ(*fourth.tokenizer, *first.tokenizer);
  EXPECT_EQ(fourth.tokens->size(), first.tokens->size());

  // The tokenizer a cached run trained, given back (as a resume reads it from its checkpoint),
  // finds that run's tokens instead of encoding the corpus again.
  with_tok.cache_dir = dir / "cache";
  with_tok.tokenizer = dir / "trained.json";
  first.tokenizer->save(*with_tok.tokenizer);
  const PreparedData resumed = prepare_data(with_tok);
  EXPECT_TRUE(resumed.reused_cache);
  EXPECT_EQ(resumed.cache_entry, first.cache_entry);
  EXPECT_EQ(*resumed.tokenizer, *first.tokenizer);
  ASSERT_EQ(resumed.tokens->size(), first.tokens->size());
  for (int64_t i = 0; i < first.tokens->size(); ++i)
    ASSERT_EQ(resumed.tokens->get(i), first.tokens->get(i));
  // Another tokenizer of the same size does not take them.
  std::string other = small_corpus();
  std::reverse(other.begin(), other.end());
  const std::vector<std::string> others = {other, other};
  const BpeTokenizer stranger = BpeTokenizer::train(others, {.vocab_size = 300});
  ASSERT_FALSE(stranger == *first.tokenizer);
  stranger.save(dir / "stranger.json");
  with_tok.tokenizer = dir / "stranger.json";
  const PreparedData other_tokens = prepare_data(with_tok);
  EXPECT_FALSE(other_tokens.reused_cache);
  EXPECT_NE(other_tokens.cache_entry, first.cache_entry);

  DataOptions tokens_in{.data = first.cache_entry / "tokens.tsrtok"};
  PreparedData fifth = prepare_data(tokens_in);
  EXPECT_EQ(fifth.format, DataFormat::kTokenFile);
  EXPECT_EQ(fifth.vocab_size, 300);
  EXPECT_FALSE(fifth.tokenizer.has_value());
}

TEST(Prepare, ConcurrentPreparationsAgree) {
  TempDir dir;
  write_file(dir / "corpus.txt", small_corpus());
  DataOptions o{.data = dir / "corpus.txt", .vocab_size = 290, .cache_dir = dir / "cache"};
  std::vector<PreparedData> results(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] { results[i] = prepare_data(o); });
  for (auto& t : threads) t.join();
  PreparedData again = prepare_data(o);
  EXPECT_TRUE(again.reused_cache);
  for (const auto& r : results) {
    ASSERT_EQ(r.tokens->size(), again.tokens->size());
    EXPECT_EQ(*r.tokenizer, *again.tokenizer);
  }
  std::size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "cache")) {
    ++entries;
    for (const auto& f : std::filesystem::directory_iterator(e.path()))
      EXPECT_EQ(f.path().string().find(".tmp"), std::string::npos) << f.path();
  }
  EXPECT_EQ(entries, 1u);
}

TEST(Prepare, MissingDataPathIsConfigError) {
  EXPECT_THROW(prepare_data({.data = "/nonexistent/corpus.txt"}), ConfigError);
}

TEST(Prepare, RawBinOutOfRangeNamesVocabulary) {
  TempDir dir;
  std::string bytes{'\x01', '\x00', '\x51', '\xc4'};  // ids 1, 50257
  write_file(dir / "train.bin", bytes);
  try {
    prepare_data({.data = dir / "train.bin", .vocab_size = 50257});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("50257"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.bin"), std::string::npos) << msg;
  }
  PreparedData ok = prepare_data({.data = dir / "train.bin", .vocab_size = 50258});
  EXPECT_EQ(ok.tokens->size(), 2);
  EXPECT_EQ(ok.format, DataFormat::kRawUint16);
}

}  // namespace
}  // namespace tessera::data
