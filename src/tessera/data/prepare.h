// --data resolution: turns what the user named (or the default corpus) into a TokenSource and,
// for text, the tokenizer, with an on-disk cache so a second run neither retrains nor re-encodes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "tessera/data/bpe_tokenizer.h"
#include "tessera/data/corpus.h"
#include "tessera/data/token_source.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {

struct DataOptions {
  // --data: a text file, a directory of text files, a tessera token file or a raw uint16 .bin.
  // Empty: the default corpus (default_corpus_files()).
  std::filesystem::path data{};
  // Vocabulary size of the tokenizer to train for text input, and the id bound for a raw .bin
  // read without a tokenizer. Ignored when `tokenizer` is set (its vocabulary size wins).
  int vocab_size = 512;
  // Reserve <|endoftext|> (id vocab_size-1) and put it after every document.
  bool end_of_text = true;
  // An existing tokenizer.json to use instead of training one (resume, eval, sample: the one
  // saved beside the checkpoint). For token inputs, its vocabulary size bounds the ids.
  std::optional<std::filesystem::path> tokenizer{};
  // Where prepared text is cached, in a subdirectory per (corpus, tokenizer) key holding
  // tokenizer.json and tokens.tsrtok. Empty: nothing is written, tokens stay in memory.
  std::filesystem::path cache_dir{};
};

struct PreparedData {
  std::shared_ptr<const TokenSource> tokens;
  // The tokenizer: trained, loaded from the cache or from DataOptions::tokenizer. Empty for
  // token inputs read without a tokenizer.
  std::optional<BpeTokenizer> tokenizer;
  // A tokenizer of another format that DataOptions::tokenizer names (a Hugging Face tokenizer.json,
  // a SentencePiece tokenizer.model: load_tokenizer.h) and that file. Text is then encoded with it
  // document by document, each followed by its EOS, and kept in memory (not cached).
  std::shared_ptr<const Tokenizer> external;
  std::filesystem::path external_source;
  // The tokenizer the text was encoded with, of either kind; null for token inputs without one.
  std::shared_ptr<const Tokenizer> text_tokenizer() const;
  // Every token id is < vocab_size (checked).
  int64_t vocab_size = 0;
  DataFormat format = DataFormat::kText;
  // The cache subdirectory used (empty when none); tokenizer.json inside it is the tokenizer.
  std::filesystem::path cache_entry;
  bool reused_cache = false;  // true when the tokens came from an existing cache entry
  int64_t text_bytes = 0;     // bytes of text tokenized (0 for token inputs)
  int64_t documents = 0;      // documents in the text (0 for token inputs)
  std::string description;    // one line for the log, e.g. "default corpus: 46 files, ..."
};

// Resolves options.data (see detect_data_format). Throws ConfigError for a missing path or
// corpus, a token id out of range or a bad vocabulary size; IoError for corrupt files.
PreparedData prepare_data(const DataOptions& options);

}  // namespace tessera::data
