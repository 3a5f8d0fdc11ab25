// Fuzz target: a Hugging Face GPT-2 config.json (io/hf_config.h). A config that parses must
// survive a write/read round trip unchanged.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tessera/core/error.h"
#include "tessera/io/hf_config.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::write_input("config.json", data, size);
  try {
    const io::HfGptConfig c = io::read_hf_config(path);
    fuzz::require(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.vocab_size > 0 &&
                      c.n_positions > 0 && c.layer_norm_epsilon > 0,
                  "every size of a parsed config is positive");
    fuzz::require(c.n_embd % c.n_head == 0, "n_head divides n_embd");
    fuzz::require(io::parse_hf_config(io::hf_config_to_json(c), "round trip") == c,
                  "a parsed config survives hf_config_to_json and parse_hf_config");
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed file.
  }
  return 0;
}
