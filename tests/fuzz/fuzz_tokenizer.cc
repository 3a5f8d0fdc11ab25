// Fuzz target: a tokenizer.json (data/bpe_tokenizer.h). A tokenizer that loads must survive a
// save/load round trip, know the bytes of every id, and decode(encode(s)) must give back s
// (the input bytes themselves serve as s).
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tessera/core/error.h"
#include "tessera/data/bpe_tokenizer.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::write_input("tokenizer.json", data, size);
  try {
    const data::BpeTokenizer tok = data::BpeTokenizer::load(path);
    fuzz::require(data::BpeTokenizer::from_json(tok.to_json(), "round trip") == tok,
                  "a loaded tokenizer survives to_json and from_json");
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const std::vector<uint32_t> ids = tok.encode(text);
    for (uint32_t id : ids) {
      fuzz::require(static_cast<int>(id) < tok.vocab_size() && id != tok.end_of_text(),
                    "encode emits ids of the vocabulary, never end-of-text");
    }
    fuzz::require(tok.decode(ids) == text, "decode(encode(s)) == s");
    for (int id = 0; id < tok.vocab_size(); ++id) {
      fuzz::require(!tok.token_bytes(static_cast<uint32_t>(id)).empty(),
                    "every id has at least one byte");
    }
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed file.
  }
  return 0;
}
