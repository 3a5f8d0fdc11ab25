#include "tessera/data/bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <system_error>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/data/pretokenizer.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/json_parse.h"

namespace tessera::data {
namespace {

constexpr int kFormatVersion = 1;
constexpr std::string_view kFormatName = "tessera-bpe";
constexpr std::string_view kPretokenizerName = "tessera-ascii-v1";
constexpr int kMaxVocabSize = 1 << 20;

inline uint64_t pair_key(uint32_t a, uint32_t b) {
  return (static_cast<uint64_t>(a) << 32) | b;
}

// Replaces every (a, b) in `sym`, left to right, with `c`. Returns false when none was found.
bool merge_in_place(std::vector<uint32_t>& sym, uint32_t a, uint32_t b, uint32_t c) {
  std::size_t out = 0;
  bool found = false;
  for (std::size_t i = 0; i < sym.size();) {
    if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
      sym[out++] = c;
      i += 2;
      found = true;
    } else {
      sym[out++] = sym[i++];
    }
  }
  sym.resize(out);
  return found;
}

struct HeapEntry {
  int64_t count;
  uint64_t key;
  // priority_queue pops the largest: higher count first, then the smaller pair.
  bool operator<(const HeapEntry& o) const {
    return count != o.count ? count < o.count : key > o.key;
  }
};

// Incremental BPE trainer over unique chunk words weighted by their frequency.
class Trainer {
 public:
  explicit Trainer(const std::unordered_map<std::string_view, int64_t>& word_counts) {
    std::vector<std::pair<std::string_view, int64_t>> sorted(word_counts.begin(),
                                                             word_counts.end());
    std::sort(sorted.begin(), sorted.end());  // deterministic word order
    words_.reserve(sorted.size());
    freq_.reserve(sorted.size());
    for (const auto& [text, count] : sorted) {
      if (text.size() < 2) continue;  // no pairs
      std::vector<uint32_t> sym(text.size());
      for (std::size_t i = 0; i < text.size(); ++i) sym[i] = static_cast<unsigned char>(text[i]);
      words_.push_back(std::move(sym));
      freq_.push_back(count);
    }
    for (uint32_t w = 0; w < words_.size(); ++w) {
      const auto& sym = words_[w];
      for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
        uint64_t k = pair_key(sym[i], sym[i + 1]);
        count_[k] += freq_[w];
        where_[k].push_back(w);
      }
    }
    for (const auto& [k, c] : count_) heap_.push({c, k});
  }

  // Learns the next merge, creating id `new_id`. Returns false when no pair is left.
  bool step(uint32_t new_id, BpeTokenizer::Merge& merge) {
    uint64_t key = 0;
    for (;;) {
      if (heap_.empty()) return false;
      HeapEntry top = heap_.top();
      heap_.pop();
      auto it = count_.find(top.key);
      int64_t actual = it == count_.end() ? 0 : it->second;
      if (actual == top.count && actual > 0) {
        key = top.key;
        break;
      }
      if (actual > 0 && actual < top.count) heap_.push({actual, top.key});
    }
    const auto a = static_cast<uint32_t>(key >> 32), b = static_cast<uint32_t>(key);
    merge = {a, b};

    std::vector<uint32_t> ws = std::move(where_[key]);
    where_.erase(key);
    std::sort(ws.begin(), ws.end());
    ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
    std::vector<uint64_t> grown;
    for (uint32_t w : ws) {
      auto& sym = words_[w];
      std::vector<uint32_t> before = sym;
      if (!merge_in_place(sym, a, b, new_id)) continue;
      const int64_t f = freq_[w];
      for (std::size_t i = 0; i + 1 < before.size(); ++i) {
        uint64_t k = pair_key(before[i], before[i + 1]);
        auto it = count_.find(k);
        if ((it->second -= f) == 0) count_.erase(it);
      }
      for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
        uint64_t k = pair_key(sym[i], sym[i + 1]);
        count_[k] += f;
        if (sym[i] == new_id || sym[i + 1] == new_id) {
          where_[k].push_back(w);
          grown.push_back(k);
        }
      }
    }
    std::sort(grown.begin(), grown.end());
    grown.erase(std::unique(grown.begin(), grown.end()), grown.end());
    for (uint64_t k : grown) {
      auto it = count_.find(k);
      if (it != count_.end()) heap_.push({it->second, k});
    }
    return true;
  }

 private:
  std::vector<std::vector<uint32_t>> words_;
  std::vector<int64_t> freq_;
  std::unordered_map<uint64_t, int64_t> count_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where_;
  std::priority_queue<HeapEntry> heap_;
};

[[noreturn]] void malformed(const std::string& source, const std::string& what) {
  throw IoError(detail::concat("the tokenizer file ", source, " is malformed: ", what,
                               "; expected a tessera BPE tokenizer (JSON with format \"",
                               kFormatName, "\", version ", kFormatVersion,
                               ", vocab_size, end_of_text and merges); see docs/DATA.md"));
}

}  // namespace

BpeTokenizer::BpeTokenizer() {
  build_tables();
}

BpeTokenizer::BpeTokenizer(std::vector<Merge> merges, bool end_of_text)
    : merges_(std::move(merges)) {
  constexpr std::size_t kMaxMerges = kMaxVocabSize - kNumByteTokens;
  TESSERA_CHECK_AS(ConfigError, merges_.size() <= kMaxMerges, "a BPE tokenizer of ", merges_.size(),
                   " merges is too large; at most ", kMaxMerges, " are supported");
  // Token lengths in bytes: merges never cross a pre-tokenizer chunk, so no token is longer than
  // kMaxChunkBytes. Checked before the vocabulary is built: doubling merges ((a, a), then the
  // result with itself, ...) would otherwise ask for 2^k bytes after k merges.
  std::vector<std::size_t> length(kNumByteTokens + merges_.size(), 1);
  for (std::size_t i = 0; i < merges_.size(); ++i) {
    const uint32_t next = kNumByteTokens + static_cast<uint32_t>(i);
    const auto [a, b] = merges_[i];
    TESSERA_CHECK_AS(ConfigError, a < next && b < next, "BPE merge ", i, " (", a, ", ", b,
                     ") names an id that is not defined before it (ids must be < ", next, ")");
    length[next] = length[a] + length[b];
    TESSERA_CHECK_AS(ConfigError, length[next] <= kMaxChunkBytes, "BPE merge ", i, " (", a, ", ", b,
                     ") makes a token of ", length[next], " bytes; tokens are at most ",
                     kMaxChunkBytes, " bytes (one pre-tokenizer chunk)");
  }
  if (end_of_text) end_of_text_ = kNumByteTokens + static_cast<uint32_t>(merges_.size());
  build_tables();
}

void BpeTokenizer::build_tables() {
  vocab_.clear();
  vocab_.reserve(kNumByteTokens + merges_.size() + 1);
  for (uint32_t b = 0; b < kNumByteTokens; ++b) vocab_.emplace_back(1, static_cast<char>(b));
  rank_.clear();
  rank_.reserve(merges_.size() * 2);
  for (std::size_t i = 0; i < merges_.size(); ++i) {
    const auto [a, b] = merges_[i];
    vocab_.push_back(vocab_[a] + vocab_[b]);
    auto [it, inserted] = rank_.emplace(pair_key(a, b), static_cast<uint32_t>(i));
    TESSERA_CHECK_AS(ConfigError, inserted, "BPE merge ", i, " (", a, ", ", b, ") repeats merge ",
                     it->second, "; every pair may be merged only once");
  }
  if (end_of_text_) vocab_.emplace_back(kEndOfTextText);
}

BpeTokenizer BpeTokenizer::train(std::string_view text, const BpeTrainOptions& options) {
  std::vector<std::string> docs{std::string(text)};
  return train(docs, options);
}

BpeTokenizer BpeTokenizer::train(std::span<const std::string> documents,
                                 const BpeTrainOptions& options) {
  const int reserved = options.end_of_text ? 1 : 0;
  const int min_vocab = static_cast<int>(kNumByteTokens) + reserved;
  TESSERA_CHECK_AS(
      ConfigError, options.vocab_size >= min_vocab && options.vocab_size <= kMaxVocabSize,
      "the BPE vocabulary size ", options.vocab_size, " is out of range; it must be in [",
      min_vocab, ", ", kMaxVocabSize, "] (256 byte tokens",
      options.end_of_text ? " plus <|endoftext|>" : "", " come first)");
  const int num_merges = options.vocab_size - min_vocab;

  std::unordered_map<std::string_view, int64_t> word_counts;
  for (const std::string& doc : documents)
    for_each_chunk(doc, [&](std::string_view chunk) { ++word_counts[chunk]; });

  Trainer trainer(word_counts);
  std::vector<Merge> merges;
  merges.reserve(static_cast<std::size_t>(num_merges));
  for (int i = 0; i < num_merges; ++i) {
    Merge m;
    if (!trainer.step(kNumByteTokens + static_cast<uint32_t>(i), m)) {
      throw ConfigError(detail::concat(
          "the corpus is too small for a BPE vocabulary of ", options.vocab_size,
          " tokens: it has only enough distinct byte pairs for ", min_vocab + i,
          "; choose a vocabulary size of at most ", min_vocab + i, " or use a larger corpus"));
    }
    merges.push_back(m);
  }
  return BpeTokenizer(std::move(merges), options.end_of_text);
}

void BpeTokenizer::encode_chunk(std::string_view chunk, std::vector<uint32_t>& out) const {
  const std::size_t first = out.size();
  for (char c : chunk) out.push_back(static_cast<unsigned char>(c));
  if (rank_.empty() || chunk.size() < 2) return;
  // Apply the lowest-ranked merge present, everywhere in the chunk, until none applies.
  std::vector<uint32_t> sym(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  for (;;) {
    uint32_t best = std::numeric_limits<uint32_t>::max();
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = rank_.find(pair_key(sym[i], sym[i + 1]));
      if (it != rank_.end() && it->second < best) best = it->second;
    }
    if (best == std::numeric_limits<uint32_t>::max()) break;
    const auto [a, b] = merges_[best];
    merge_in_place(sym, a, b, kNumByteTokens + best);
    if (sym.size() < 2) break;
  }
  out.resize(first);
  out.insert(out.end(), sym.begin(), sym.end());
}

// Tokens of each distinct chunk, by where they first appeared in the output vector.
struct BpeTokenizer::ChunkCache {
  std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> where;
};

void BpeTokenizer::encode_cached(std::string_view text, std::vector<uint32_t>& out,
                                 ChunkCache& cache) const {
  for_each_chunk(text, [&](std::string_view chunk) {
    if (chunk.size() == 1) {
      out.push_back(static_cast<unsigned char>(chunk[0]));
      return;
    }
    auto it = cache.where.find(chunk);
    if (it != cache.where.end()) {
      const auto [pos, len] = it->second;
      for (std::size_t i = 0; i < len; ++i) out.push_back(out[pos + i]);
      return;
    }
    const std::size_t pos = out.size();
    encode_chunk(chunk, out);
    cache.where.emplace(chunk, std::pair{pos, out.size() - pos});
  });
}

void BpeTokenizer::encode_append(std::string_view text, std::vector<uint32_t>& out) const {
  ChunkCache cache;
  encode_cached(text, out, cache);
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode_append(text, out);
  return out;
}

std::vector<uint32_t> BpeTokenizer::encode_documents(std::span<const std::string> documents) const {
  std::size_t bytes = 0;
  for (const auto& d : documents) bytes += d.size();
  std::vector<uint32_t> out;
  out.reserve(bytes / 3 + documents.size() + 16);
  ChunkCache cache;  // shared by all documents (the documents outlive it)
  for (const auto& doc : documents) {
    encode_cached(doc, out, cache);
    if (end_of_text_) out.push_back(*end_of_text_);
  }
  return out;
}

const std::string& BpeTokenizer::token_bytes(uint32_t id) const {
  TESSERA_CHECK_AS(ConfigError, id < vocab_.size(), "token id ", id,
                   " is out of range for this tokenizer; ids must be < ", vocab_.size());
  return vocab_[id];
}

std::string BpeTokenizer::decode(std::span<const uint32_t> tokens) const {
  std::string out;
  out.reserve(tokens.size() * 3);
  for (uint32_t t : tokens) out += token_bytes(t);
  return out;
}

std::string BpeTokenizer::to_json() const {
  nlohmann::json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["pretokenizer"] = kPretokenizerName;
  j["vocab_size"] = vocab_size();
  j["end_of_text"] = end_of_text_ ? nlohmann::json(*end_of_text_) : nlohmann::json(nullptr);
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : merges_) merges.push_back({a, b});
  j["merges"] = std::move(merges);
  return j.dump() + "\n";
}

BpeTokenizer BpeTokenizer::from_json(std::string_view json_text, const std::string& source) {
  nlohmann::json j;
  try {
    j = io::parse_json(json_text);
  } catch (const nlohmann::json::exception& e) {
    malformed(source, detail::concat("it is not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) malformed(source, "the top level is not a JSON object");
  auto field = [&](const char* name) -> const nlohmann::json& {
    if (!j.contains(name)) malformed(source, detail::concat("the field \"", name, "\" is missing"));
    return j[name];
  };
  const auto& format = field("format");
  if (!format.is_string() || format.get<std::string>() != kFormatName)
    malformed(source,
              detail::concat("\"format\" is ", format.dump(), ", not \"", kFormatName, "\""));
  const auto& version = field("version");
  if (!version.is_number_integer() || version.get<int64_t>() != kFormatVersion)
    malformed(source, detail::concat("\"version\" is ", version.dump(),
                                     "; this build reads version ", kFormatVersion));
  if (j.contains("pretokenizer") &&
      (!j["pretokenizer"].is_string() || j["pretokenizer"].get<std::string>() != kPretokenizerName))
    malformed(source, detail::concat("\"pretokenizer\" is ", j["pretokenizer"].dump(), ", not \"",
                                     kPretokenizerName, "\""));
  const auto& merges_json = field("merges");
  if (!merges_json.is_array()) malformed(source, "\"merges\" is not an array");
  std::vector<Merge> merges;
  merges.reserve(merges_json.size());
  for (std::size_t i = 0; i < merges_json.size(); ++i) {
    const auto& m = merges_json[i];
    const uint64_t next = kNumByteTokens + i;
    if (!m.is_array() || m.size() != 2 || !m[0].is_number_unsigned() || !m[1].is_number_unsigned())
      malformed(source, detail::concat("merge ", i, " is ", m.dump(),
                                       ", not a pair of non-negative integer ids"));
    const uint64_t a = m[0].get<uint64_t>(), b = m[1].get<uint64_t>();
    if (a >= next || b >= next)
      malformed(source, detail::concat("merge ", i, " is ", m.dump(), " but only ids below ", next,
                                       " exist at that point"));
    merges.emplace_back(static_cast<uint32_t>(a), static_cast<uint32_t>(b));
  }
  const auto& eot = field("end_of_text");
  const uint64_t eot_id = kNumByteTokens + merges.size();
  if (!eot.is_null() && !(eot.is_number_unsigned() && eot.get<uint64_t>() == eot_id))
    malformed(source, detail::concat("\"end_of_text\" is ", eot.dump(), "; it must be null or ",
                                     eot_id, " (the id after the last merge)"));
  const auto& vs = field("vocab_size");
  const uint64_t expected = eot_id + (eot.is_null() ? 0 : 1);
  if (!vs.is_number_unsigned() || vs.get<uint64_t>() != expected)
    malformed(source, detail::concat("\"vocab_size\" is ", vs.dump(), " but 256 byte tokens + ",
                                     merges.size(), " merges",
                                     eot.is_null() ? "" : " + end_of_text", " make ", expected));
  try {
    return BpeTokenizer(std::move(merges), !eot.is_null());
  } catch (const ConfigError& e) {
    malformed(source, e.what());
  }
}

void BpeTokenizer::save(const std::filesystem::path& path) const {
  // Parent directories first; if that fails, the writer below throws an IoError naming the path.
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  io::write_file_atomic(path, to_json());
}

BpeTokenizer BpeTokenizer::load(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK_AS(IoError, f.is_open(), "could not open the tokenizer file ", path.string(),
                   "; it does not exist or is not readable");
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_json(ss.str(), path.string());
}

uint64_t BpeTokenizer::fingerprint() const {
  return stable_hash(to_json());
}

}  // namespace tessera::data
