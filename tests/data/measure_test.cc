// Measurements on the default corpus; disabled by default (run with
// --gtest_also_run_disabled_tests --gtest_filter='*Measure*').
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "tessera/data/bpe_tokenizer.h"
#include "tessera/data/corpus.h"
#include "tessera/data/token_source.h"

namespace tessera::data {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Measure, DISABLED_DefaultCorpus) {
  if (!std::filesystem::is_directory(kDefaultCorpusDir)) GTEST_SKIP() << "fortunes not installed";
  auto t0 = std::chrono::steady_clock::now();
  TextCorpus corpus = read_text_corpus(default_corpus_files());
  std::printf("corpus: %zu files, %zu documents, %llu bytes, read in %.3f s\n", corpus.files.size(),
              corpus.documents.size(), static_cast<unsigned long long>(corpus.bytes),
              seconds_since(t0));
  for (int vocab : {512, 4096}) {
    t0 = std::chrono::steady_clock::now();
    BpeTokenizer tok = BpeTokenizer::train(corpus.documents, {.vocab_size = vocab});
    const double train_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::vector<uint32_t> ids = tok.encode_documents(corpus.documents);
    const double enc_s = seconds_since(t0);
    TokenVector tv(std::move(ids));
    std::printf(
        "vocab %d: train %.2f s, encode %.3f s (%.1f MB/s), %lld tokens, %.3f bytes/token, "
        "unigram entropy %.4f nats/token\n",
        vocab, train_s, enc_s, static_cast<double>(corpus.bytes) / enc_s / 1e6,
        static_cast<long long>(tv.size()),
        static_cast<double>(corpus.bytes) / static_cast<double>(tv.size()), unigram_entropy(tv));
  }
}

}  // namespace
}  // namespace tessera::data
