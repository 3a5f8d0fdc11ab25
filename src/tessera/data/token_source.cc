#include "tessera/data/token_source.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "tessera/core/error.h"

namespace tessera::data {

uint32_t TokenSource::max_id() const {
  uint32_t m = 0;
  const int64_t n = size();
  std::vector<int32_t> buf;
  constexpr int64_t kChunk = 1 << 16;
  for (int64_t first = 0; first < n; first += kChunk) {
    const int64_t len = std::min(kChunk, n - first);
    buf.resize(static_cast<std::size_t>(len));
    read(first, len, buf.data());
    for (int32_t t : buf) m = std::max(m, static_cast<uint32_t>(t));
  }
  return m;
}

void check_token_range(const TokenSource& source, int64_t first, int64_t n) {
  TESSERA_CHECK(first >= 0 && n >= 0 && first <= source.size() - n, "token range [", first, ", ",
                first + n, ") is outside ", source.name(), ", which holds ", source.size(),
                " tokens");
}

void TokenVector::read(int64_t first, int64_t n, int32_t* out) const {
  check_token_range(*this, first, n);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<int32_t>(tokens_[static_cast<std::size_t>(first + i)]);
}

void check_token_ids(const TokenSource& source, int64_t vocab_size) {
  TESSERA_CHECK_AS(ConfigError, vocab_size > 0, "the vocabulary size must be positive, not ",
                   vocab_size);
  if (static_cast<int64_t>(source.max_id()) < vocab_size) return;  // fast path: chunked scan
  const int64_t n = source.size();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t t = source.get(i);
    if (static_cast<int64_t>(t) >= vocab_size) {
      throw ConfigError(detail::concat(
          "token id ", t, " at position ", i, " of ", source.name(),
          " is out of range: the vocabulary has ", vocab_size, " ids (0..", vocab_size - 1,
          "); use the tokenizer these tokens were made with, or a vocabulary size of at least ",
          static_cast<int64_t>(t) + 1, " (GPT-2 token files need 50257)"));
    }
  }
}

double unigram_entropy(const TokenSource& source, int64_t begin, int64_t end) {
  if (end < 0) end = source.size();
  check_token_range(source, begin, end - begin);
  const int64_t n = end - begin;
  if (n == 0) return 0.0;
  std::unordered_map<uint32_t, int64_t> sparse;
  std::vector<int64_t> dense(1 << 16, 0);
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t t = source.get(i);
    if (t < dense.size()) {
      ++dense[t];
    } else {
      ++sparse[t];
    }
  }
  double h = 0.0;
  const double total = static_cast<double>(n);
  auto add = [&](int64_t c) {
    if (c == 0) return;
    const double p = static_cast<double>(c) / total;
    h -= p * std::log(p);
  };
  for (int64_t c : dense) add(c);
  for (const auto& kv : sparse) add(kv.second);
  return h;
}

}  // namespace tessera::data
