// RegexSplitter: Hugging Face's Split pre-tokenizer with behavior "Isolated", on PCRE2 (UTF mode
// with Unicode properties: \p{L}, \p{N}, Unicode \s and case folding; possessive quantifiers,
// atomic groups and lookahead). Every match is a piece and so is the text between two matches.
// The patterns are those tokenizer.json files carry (GPT-2's, Llama 3's, Qwen2's, ...); Hugging
// Face runs them on Oniguruma, and where its Ruby syntax reads a pattern differently from PCRE2
// the pattern is rewritten first (oniguruma_syntax.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

class RegexSplitter {
 public:
  // A regular expression, or with `literal` a plain string to find. Throws ConfigError naming
  // `source` (where the pattern comes from) and the position PCRE2 objects to when the pattern
  // does not compile.
  RegexSplitter(std::string_view pattern, bool literal, const std::string& source);

  // Calls fn(piece) for every non-empty piece of `text`, in order; the pieces concatenate to
  // `text`. Matches are found left to right without overlap; an empty match cuts the text where
  // it is (as Hugging Face's Split does). Text that is not valid UTF-8 is accepted: an ill-formed
  // byte matches no part of a pattern, so it ends up in a piece between matches. Thread-safe.
  // Throws tessera::Error when PCRE2 gives up on the text (its match limit).
  void split(std::string_view text, const std::function<void(std::string_view)>& fn) const;
  std::vector<std::string_view> split(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::shared_ptr<const Compiled> compiled_;  // shared by copies: matching does not modify it
};

}  // namespace tessera::data
