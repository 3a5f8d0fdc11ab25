#include "tessera/train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/core/philox.h"

namespace tessera::train {

int32_t sample_logits(const float* logits, int V, float temperature, int top_k, float u) {
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  int k = (top_k <= 0 || top_k > V) ? V : top_k;
  // Highest logits first; ties broken by id so sampling is deterministic.
  auto higher = [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), higher);
  double max_logit = logits[ids[0]];
  std::vector<double> p(k);
  double z = 0;
  for (int i = 0; i < k; ++i) z += p[i] = std::exp((logits[ids[i]] - max_logit) / temperature);
  double target = u * z, acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[i];
    if (acc >= target) return ids[i];
  }
  return ids[k - 1];
}

std::vector<int32_t> generate(nn::GPT& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  const std::unique_ptr<comm::Communicator> one_stage = comm::one_rank();  // no pipeline
  PipelineForward whole({&model}, *one_stage);
  return generate(whole, prompt, opt, on_token);
}

std::vector<int32_t> generate(PipelineForward& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  TESSERA_CHECK_AS(ConfigError, opt.temperature > 0, "temperature must be positive");
  TESSERA_CHECK_AS(ConfigError, !prompt.empty(), "sampling needs a prompt of at least one token");
  const int V = model.config().vocab_size;
  const int block = model.config().block_size;
  std::vector<int32_t> context = prompt, out;
  const uint64_t stream = stable_hash("sample");
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    int T = std::min<int>(block, static_cast<int>(context.size()));
    nn::Batch b{context.data() + context.size() - T, nullptr, 1, T, 0};
    // Collective under --tp and --pp.
    const std::vector<float> last =
        model.logits_row(b, nn::StepContext{opt.seed, 0, false, 1.0f}, T - 1);
    int32_t next = sample_logits(last.data(), V, opt.temperature, opt.top_k,
                                 philox_uniform(opt.seed, stream, static_cast<uint64_t>(i)));
    context.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  return out;
}

}  // namespace tessera::train
