// Hugging Face's tokenizers run Split patterns on Oniguruma with its Ruby syntax; tessera runs
// them on PCRE2. The two agree on what tokenizer.json patterns use (\p{..}, classes, lookahead,
// atomic groups, possessive ?+ *+ ++, (?i:...)) except in three places, which this rewrite
// removes so PCRE2 matches what Oniguruma matches:
//   * X{n,m}+ is X{n,m} repeated one or more times in Ruby syntax (possessive only in Java
//     syntax), a possessive X{n,m} in PCRE2: written (?:X{n,m})+ for PCRE2;
//   * \h and \H are hexadecimal digits (and not) in Ruby syntax, horizontal space in PCRE2:
//     written [0-9a-fA-F] and [^0-9a-fA-F];
//   * ^ and $ match at every line in Ruby syntax: the caller compiles with PCRE2_MULTILINE.
#pragma once

#include <string>
#include <string_view>

namespace tessera::data {

// The PCRE2 pattern for an Oniguruma (Ruby syntax) pattern. A pattern it cannot follow (an
// unclosed class, say) comes back with only the rewrites before that point: PCRE2 then reports
// the error.
std::string oniguruma_to_pcre2(std::string_view pattern);

}  // namespace tessera::data
