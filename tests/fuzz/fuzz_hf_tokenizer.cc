// Fuzz target: a Hugging Face tokenizer.json (data/hf_bpe_tokenizer.h, data/hf_tokenizer_json.h,
// the pre-tokenizer regexes through data/regex_splitter.h). A tokenizer that loads must encode
// the input bytes themselves (any bytes, UTF-8 or not) to ids of its vocabulary that decode,
// encoding with special tokens must put the template around those ids, and every id below
// vocab_size() must decode or be refused with ConfigError.
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tessera/core/error.h"
#include "tessera/data/hf_bpe_tokenizer.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::write_input("tokenizer.json", data, size);
  try {
    const data::HfBpeTokenizer tok = data::HfBpeTokenizer::load(path);
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const std::vector<uint32_t> ids = tok.encode(text);
    for (uint32_t id : ids) {
      fuzz::require(static_cast<int64_t>(id) < tok.vocab_size(),
                    "encode emits ids below vocab_size()");
    }
    tok.decode(ids);  // every id encode emits decodes
    std::vector<uint32_t> framed = tok.template_prefix();
    framed.insert(framed.end(), ids.begin(), ids.end());
    framed.insert(framed.end(), tok.template_suffix().begin(), tok.template_suffix().end());
    fuzz::require(tok.encode_with_special_tokens(text) == framed,
                  "encode_with_special_tokens is the template around encode");
    const int limit = std::min(tok.vocab_size(), 4096);
    for (int id = 0; id < limit; ++id) {
      try {
        tok.decode(std::vector<uint32_t>{static_cast<uint32_t>(id)});
      } catch (const ConfigError&) {
        // An id in a gap of the vocabulary.
      }
    }
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed or unsupported file.
  }
  return 0;
}
