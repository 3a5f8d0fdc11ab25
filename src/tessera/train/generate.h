// Autoregressive sampling from a GPT: temperature, top-k, and a counter-based RNG so the same
// seed gives the same text.
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
};

// Returns the new tokens (not the prompt). The context is the last block_size tokens. `on_token`
// is called with each token as it is drawn (for streaming output).
std::vector<int32_t> generate(nn::GPT& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});
// The same through a model spread over pipeline ranks (collective; every rank gets the tokens).
std::vector<int32_t> generate(PipelineForward& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});

// Draws one token id from `logits[0..V)` (read-only) with temperature and top-k, using `u`
// uniform in (0, 1].
int32_t sample_logits(const float* logits, int V, float temperature, int top_k, float u);

}  // namespace tessera::train
