#include "tessera/data/prepare.h"

#include <cinttypes>
#include <cstdio>
#include <system_error>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/data/bpe_tokenizer_adapter.h"
#include "tessera/data/load_tokenizer.h"
#include "tessera/data/token_file.h"

namespace tessera::data {
namespace fs = std::filesystem;

namespace {

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

std::string format_name(DataFormat f) {
  switch (f) {
    case DataFormat::kTextDirectory:
      return "text directory";
    case DataFormat::kText:
      return "text file";
    case DataFormat::kTokenFile:
      return "tessera token file";
    case DataFormat::kRawUint16:
      return "raw uint16 token file";
  }
  return "?";
}

// Loads a cache entry; nullopt when it is absent or unusable (it is then rebuilt).
std::optional<PreparedData> load_cache_entry(const fs::path& entry) {
  std::error_code ec;
  if (!fs::exists(entry / "tokenizer.json", ec) || !fs::exists(entry / "tokens.tsrtok", ec))
    return std::nullopt;
  try {
    PreparedData p;
    p.tokenizer = BpeTokenizer::load(entry / "tokenizer.json");
    auto tokens = TokenFile::open(entry / "tokens.tsrtok");
    if (tokens->vocab_size() != static_cast<uint32_t>(p.tokenizer->vocab_size()))
      return std::nullopt;
    p.vocab_size = p.tokenizer->vocab_size();
    p.tokens = std::move(tokens);
    return p;
  } catch (const Error&) {
    return std::nullopt;  // corrupt or from another version: rebuild it
  }
}

// Text encoded with a tokenizer of another format (a Hugging Face or SentencePiece file): each
// document, then the tokenizer's EOS when it has one. In memory; the tokenizer stays its file.
PreparedData encode_with_external(const DataOptions& o, const TextCorpus& corpus,
                                  std::shared_ptr<const Tokenizer> t, const std::string& what) {
  PreparedData p;
  std::vector<uint32_t> ids;
  const std::optional<uint32_t> eos = t->special_tokens().eos;
  for (const auto& doc : corpus.documents) {
    const std::vector<uint32_t> d = t->encode(doc);
    ids.insert(ids.end(), d.begin(), d.end());
    if (eos) ids.push_back(*eos);
  }
  p.vocab_size = t->vocab_size();
  p.external = std::move(t);
  p.external_source = *o.tokenizer;
  p.tokens = std::make_shared<TokenVector>(
      std::move(ids), what + " (tokenized in memory with " + o.tokenizer->string() + ")");
  return p;
}

PreparedData prepare_text(const DataOptions& o, DataFormat format) {
  std::vector<fs::path> files;
  std::string what;
  if (o.data.empty()) {
    files = default_corpus_files();
    what = "default corpus " + std::string(kDefaultCorpusDir);
  } else if (format == DataFormat::kTextDirectory) {
    files = list_text_files(o.data);
    what = o.data.string();
  } else {
    files = {o.data};
    what = o.data.string();
  }
  TextCorpus corpus = read_text_corpus(files);

  std::optional<BpeTokenizer> given;
  std::shared_ptr<const Tokenizer> external;
  if (o.tokenizer) {
    std::shared_ptr<const Tokenizer> t = load_tokenizer(*o.tokenizer);
    if (t->kind() == "tessera-bpe")
      given = BpeTokenizer::load(fs::is_directory(*o.tokenizer) ? *o.tokenizer / "tokenizer.json"
                                                                : *o.tokenizer);
    else
      external = std::move(t);
  }
  if (external) {
    PreparedData p = encode_with_external(o, corpus, std::move(external), what);
    p.format = format;
    p.text_bytes = static_cast<int64_t>(corpus.bytes);
    p.documents = static_cast<int64_t>(corpus.documents.size());
    p.description = detail::concat(what, ": ", files.size(), " file(s), ", corpus.documents.size(),
                                   " documents, ", corpus.bytes, " bytes -> ", p.tokens->size(),
                                   " tokens (vocab ", p.vocab_size, ", ", p.external->kind(), " ",
                                   o.tokenizer->string(), ")");
    return p;
  }
  // The cache key: the corpus, and either the given tokenizer or the training settings.
  const uint64_t corpus_key = mix_stream(corpus.fingerprint, stable_hash("tessera-data-cache-v1"));
  auto trained_key = [&](int vocab_size, bool end_of_text) {
    return mix_stream(mix_stream(corpus_key, static_cast<uint64_t>(vocab_size)),
                      end_of_text ? 1 : 0);
  };
  const uint64_t key = given ? mix_stream(corpus_key, given->fingerprint())
                             : trained_key(o.vocab_size, o.end_of_text);

  PreparedData p;
  if (!o.cache_dir.empty()) {
    const std::string vocab = std::to_string(given ? given->vocab_size() : o.vocab_size);
    auto entry_of = [&](uint64_t k) { return o.cache_dir / ("text-v" + vocab + "-" + hex16(k)); };
    p.cache_entry = entry_of(key);
    // A given tokenizer is most often the one an earlier run trained on this corpus (a resume
    // reads it from its checkpoint): that run's entry holds the tokens already.
    std::vector<fs::path> entries = {p.cache_entry};
    if (given)
      for (const bool eot : {true, false})
        entries.push_back(entry_of(trained_key(given->vocab_size(), eot)));
    for (const fs::path& entry : entries) {
      if (auto cached = load_cache_entry(entry);
          cached && (!given || *cached->tokenizer == *given)) {
        p.tokens = std::move(cached->tokens);
        p.tokenizer = std::move(cached->tokenizer);
        p.vocab_size = cached->vocab_size;
        p.reused_cache = true;
        p.cache_entry = entry;
        break;
      }
    }
  }
  if (!p.reused_cache) {
    p.tokenizer = given ? std::move(*given)
                        : BpeTokenizer::train(corpus.documents, {.vocab_size = o.vocab_size,
                                                                 .end_of_text = o.end_of_text});
    p.vocab_size = p.tokenizer->vocab_size();
    std::vector<uint32_t> ids = p.tokenizer->encode_documents(corpus.documents);
    if (!p.cache_entry.empty()) {
      p.tokenizer->save(p.cache_entry / "tokenizer.json");
      write_token_file(p.cache_entry / "tokens.tsrtok", ids, static_cast<uint32_t>(p.vocab_size));
      p.tokens = TokenFile::open(p.cache_entry / "tokens.tsrtok");
    } else {
      p.tokens = std::make_shared<TokenVector>(std::move(ids), what + " (tokenized in memory)");
    }
  }
  p.format = format;
  p.text_bytes = static_cast<int64_t>(corpus.bytes);
  p.documents = static_cast<int64_t>(corpus.documents.size());
  p.description = detail::concat(what, ": ", files.size(), " file(s), ", corpus.documents.size(),
                                 " documents, ", corpus.bytes, " bytes -> ", p.tokens->size(),
                                 " tokens (vocab ", p.vocab_size, ", ",
                                 p.reused_cache ? "cached" : "tokenized now", ")");
  return p;
}

PreparedData prepare_tokens(const DataOptions& o, DataFormat format) {
  PreparedData p;
  p.format = format;
  std::shared_ptr<TokenFile> file = format == DataFormat::kTokenFile
                                        ? TokenFile::open(o.data)
                                        : TokenFile::open_raw_uint16(o.data);
  if (o.tokenizer) {
    std::shared_ptr<const Tokenizer> t = load_tokenizer(*o.tokenizer);
    p.vocab_size = t->vocab_size();
    if (t->kind() == "tessera-bpe") {
      p.tokenizer = BpeTokenizer::load(
          fs::is_directory(*o.tokenizer) ? *o.tokenizer / "tokenizer.json" : *o.tokenizer);
    } else {
      p.external = std::move(t);
      p.external_source = *o.tokenizer;
    }
  } else if (file->vocab_size() != 0) {
    p.vocab_size = file->vocab_size();
  } else {
    p.vocab_size = o.vocab_size;
  }
  TESSERA_CHECK_AS(ConfigError, file->size() > 0, "the token file ", o.data.string(),
                   " holds no tokens");
  check_token_ids(*file, p.vocab_size);
  p.description = detail::concat(o.data.string(), ": ", format_name(format), ", ", file->size(),
                                 " tokens (vocab ", p.vocab_size, ")");
  p.tokens = std::move(file);
  return p;
}

}  // namespace

std::shared_ptr<const Tokenizer> PreparedData::text_tokenizer() const {
  if (external) return external;
  if (tokenizer) return std::make_shared<BpeTokenizerAdapter>(*tokenizer);
  return nullptr;
}

PreparedData prepare_data(const DataOptions& options) {
  if (options.data.empty()) return prepare_text(options, DataFormat::kTextDirectory);
  const DataFormat format = detect_data_format(options.data);
  if (format == DataFormat::kTokenFile || format == DataFormat::kRawUint16)
    return prepare_tokens(options, format);
  return prepare_text(options, format);
}

}  // namespace tessera::data
