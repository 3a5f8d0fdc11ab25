#include "tessera/train/generate.h"

#include <algorithm>
#include <chrono>
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

namespace {

using Clock = std::chrono::steady_clock;

// The sampling loop around `logits_after(context, i)`, the [V] logits that follow the context (its
// last block_size tokens) when drawing token i. Adds the tokens and timings to `st`.
std::vector<int32_t> sample_loop(
    const nn::GPTConfig& cfg, const std::vector<int32_t>& prompt, const SampleOptions& opt,
    const std::function<void(int32_t)>& on_token, SampleStats& st,
    const std::function<const float*(const std::vector<int32_t>&, int)>& logits_after) {
  TESSERA_CHECK_AS(ConfigError, opt.temperature > 0, "temperature must be positive");
  TESSERA_CHECK_AS(ConfigError, !prompt.empty(), "sampling needs a prompt of at least one token");
  std::vector<int32_t> context = prompt, out;
  const uint64_t stream = stable_hash("sample");
  st.prefill_tokens = std::min<int64_t>(cfg.block_size, static_cast<int64_t>(prompt.size()));
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    const Clock::time_point t0 = Clock::now();
    const float* logits = logits_after(context, i);
    const int32_t next = sample_logits(logits, cfg.vocab_size, opt.temperature, opt.top_k,
                                       philox_uniform(opt.seed, stream, static_cast<uint64_t>(i)));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    (i == 0 ? st.prefill_seconds : st.decode_seconds) += dt;
    st.decode_tokens += i > 0;
    context.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  return out;
}

}  // namespace

std::vector<int32_t> generate(nn::GPT& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token, SampleStats* stats) {
  if (!opt.kv_cache || !model.can_decode()) {
    const std::unique_ptr<comm::Communicator> one_stage = comm::one_rank();  // no pipeline
    PipelineForward whole({&model}, *one_stage);
    return generate(whole, prompt, opt, on_token, stats);
  }
  const int block = model.config().block_size;
  nn::KvCache cache = model.make_kv_cache();
  SampleStats st;
  st.kv_cache = true;
  auto logits_after = [&](const std::vector<int32_t>& context, int i) -> const float* {
    if (i > 0 && cache.room() > 0)  // the cache holds every token of the context but the last
      return model.decode(&context.back(), 1, cache);
    // The prompt's window, or (cache full) the window slid by one: prefilled at [0, T).
    st.window_prefills += i > 0;
    const int T = std::min<int>(block, static_cast<int>(context.size()));
    cache.reset();
    return model.decode(context.data() + context.size() - T, T, cache);
  };
  std::vector<int32_t> out = sample_loop(model.config(), prompt, opt, on_token, st, logits_after);
  if (stats) *stats = st;
  return out;
}

std::vector<int32_t> generate(PipelineForward& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token, SampleStats* stats) {
  // A model whole on this rank decodes with the cache where it can (every rank of a tensor- or
  // expert-parallel group, or of a ZeRO-3 engine, decides the same: none can).
  if (nn::GPT* whole = model.whole_model(); whole && opt.kv_cache && whole->can_decode())
    return generate(*whole, prompt, opt, on_token, stats);
  const int block = model.config().block_size;
  std::vector<float> last;
  auto logits_after = [&](const std::vector<int32_t>& context, int) -> const float* {
    const int T = std::min<int>(block, static_cast<int>(context.size()));
    nn::Batch b{context.data() + context.size() - T, nullptr, 1, T, 0};
    // Collective under --tp and --pp.
    last = model.logits_row(b, nn::StepContext{opt.seed, 0, false, 1.0f}, T - 1);
    return last.data();
  };
  SampleStats st;
  std::vector<int32_t> out = sample_loop(model.config(), prompt, opt, on_token, st, logits_after);
  if (stats) *stats = st;
  return out;
}

}  // namespace tessera::train
