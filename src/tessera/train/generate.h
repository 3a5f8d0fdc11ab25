// Autoregressive sampling from a GPT: temperature, top-k, and a counter-based RNG so the same
// seed gives the same text.
//
// The context is the last block_size tokens. A model whole on one rank (nn::GPT::can_decode: no
// pipeline, tensor or expert parallelism, no ZeRO-3, no MoE capacity) generates with a key/value
// cache (nn::KvCache, nn/gpt.h): the prompt's window is prefilled once, then each token is one
// decode step of one position. Past block_size tokens the window slides as before: the cache cannot
// slide (every position of the window changes), so each further token re-prefills the last
// block_size tokens into the reset cache, which costs what the full forward of the window costs.
// The tokens are those of the full forward for the same seed (sampling draws the same random
// numbers; the logits agree to rounding). Other models, and opt.kv_cache false, run the full
// forward of the window for every token.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/nn/gpt.h"
#include "tessera/train/pipeline_forward.h"

namespace tessera::train {

struct SampleOptions {
  int max_new_tokens = 200;
  float temperature = 0.8f;  // > 0
  int top_k = 40;            // 0 = the whole vocabulary
  uint64_t seed = 0;
  bool kv_cache = true;  // false: the full forward for every token, whatever the model
};

// Where a generation spent its time (model and sampling; the on_token callback excluded).
struct SampleStats {
  bool kv_cache = false;       // generated with the key/value cache
  int64_t prefill_tokens = 0;  // the tokens of the first model call: the prompt's window
  double prefill_seconds = 0;  // the first call and the first draw
  int64_t decode_tokens = 0;   // the tokens drawn after the first
  double decode_seconds = 0;
  int64_t window_prefills = 0;  // re-prefills of the window past block_size (with the cache)
};

// Returns the new tokens (not the prompt). `on_token` is called with each token as it is drawn
// (for streaming output); `stats`, if given, receives the timings.
std::vector<int32_t> generate(nn::GPT& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token = {},
                              SampleStats* stats = nullptr);
// The same through a model that may be spread over pipeline ranks (collective; every rank gets
// the tokens): with the key/value cache when the model is whole on this rank and can decode, else
// with the full forward.
std::vector<int32_t> generate(PipelineForward& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token = {},
                              SampleStats* stats = nullptr);

// Draws one token id from `logits[0..V)` (read-only) with temperature and top-k, using `u`
// uniform in (0, 1].
int32_t sample_logits(const float* logits, int V, float temperature, int top_k, float u);

}  // namespace tessera::train
