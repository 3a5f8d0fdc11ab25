#include "tessera/data/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tessera/core/error.h"
#include "tessera/data/oniguruma_syntax.h"
#include "tessera/data/utf8.h"

namespace tessera::data {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof buffer);
  return n < 0 ? detail::concat("PCRE2 error ", code)
               : std::string(reinterpret_cast<char*>(buffer));
}

// Per thread: the JIT stack (the default 32 KiB overflows on long runs of one character class)
// and the match context that hands it to pcre2_match.
struct ThreadMatchContext {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  ThreadMatchContext() {
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (stack && context) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchContext() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
  ThreadMatchContext(const ThreadMatchContext&) = delete;
  ThreadMatchContext& operator=(const ThreadMatchContext&) = delete;
};

pcre2_match_context* thread_match_context() {
  thread_local ThreadMatchContext ctx;
  return ctx.context;
}

}  // namespace

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(std::string_view pattern, bool literal, const std::string& source)
    : pattern_(pattern) {
  // UTF: characters, not bytes. MATCH_INVALID_UTF: text that is not valid UTF-8 is searched,
  // not refused (ill-formed bytes match nothing). For a regex, UCP (Unicode semantics for \s,
  // \w, \d and case folding) and MULTILINE (^ and $ at every line, as in Oniguruma's Ruby
  // syntax), on the pattern rewritten where the two engines read it differently.
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE;
  const std::string compiled_pattern = literal ? std::string(pattern) : oniguruma_to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto compiled = std::make_shared<Compiled>();
  compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled_pattern.data()),
                                 compiled_pattern.size(), options, &error, &offset, nullptr);
  TESSERA_CHECK_AS(ConfigError, compiled->code != nullptr, source, ": the pattern '", pattern,
                   "' does not compile at offset ", offset,
                   compiled_pattern == pattern ? "" : " of '" + compiled_pattern + "'", " (",
                   pcre2_message(error), ")");
  compiled->jit = pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE) == 0;
  compiled_ = std::move(compiled);
}

void RegexSplitter::split(std::string_view text,
                          const std::function<void(std::string_view)>& fn) const {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  TESSERA_CHECK(md != nullptr, "out of memory for a regular-expression match");
  struct Free {
    pcre2_match_data* md;
    ~Free() { pcre2_match_data_free(md); }
  } free_md{md};
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const std::size_t n = text.size();
  pcre2_match_context* context = compiled_->jit ? thread_match_context() : nullptr;
  std::size_t piece_start = 0;  // start of the text not yet handed out
  std::size_t pos = 0;          // where the next search starts
  while (pos <= n) {
    int rc = pcre2_match(compiled_->code, subject, n, pos, 0, md, context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
      rc = pcre2_match(compiled_->code, subject, n, pos, PCRE2_NO_JIT, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    TESSERA_CHECK(rc >= 0, "the pre-tokenizer pattern '", pattern_, "' failed on a text of ", n,
                  " bytes at offset ", pos, " (", pcre2_message(rc), ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t start = ov[0], end = ov[1];
    if (start > piece_start) fn(text.substr(piece_start, start - piece_start));
    if (end > start) {
      fn(text.substr(start, end - start));
      piece_start = pos = end;
    } else {  // an empty match: cut here and search again one character further
      piece_start = start;
      if (start >= n) break;
      pos = start + utf8::decode_at(text, start).length;
    }
  }
  if (piece_start < n) fn(text.substr(piece_start));
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  split(text, [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}

}  // namespace tessera::data
