#include "tessera/train/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/nn/gpt.h"

namespace tessera::train {
namespace {

TEST(SampleLogits, TopKAndTemperature) {
  std::vector<float> logits = {0.0f, 5.0f, 1.0f, 4.9f, -3.0f};
  // top-1 is greedy whatever the draw.
  for (float u : {0.01f, 0.5f, 1.0f}) EXPECT_EQ(sample_logits(logits.data(), 5, 1.0f, 1, u), 1);
  // top-2 only ever returns the two best.
  std::map<int, int> seen;
  for (int i = 1; i <= 100; ++i) seen[sample_logits(logits.data(), 5, 1.0f, 2, i / 100.0f)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], seen[3]);
  // A very low temperature is greedy too.
  EXPECT_EQ(sample_logits(logits.data(), 5, 1e-3f, 0, 0.99f), 1);
}

// Generation with the key/value cache against the full forward of the window per token: the same
// tokens for the same seed, for every model family, through the window sliding past block_size
// (where each token re-prefills the window into the reset cache); and models that cannot decode
// (here a mixture of experts with a capacity) fall back to the full forward.
nn::GPTConfig small(nn::Arch arch) {
  nn::GPTConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 61;
  c.dropout = 0.1f;  // configured, off in inference
  if (arch == nn::Arch::Llama) {
    c.n_kv_head = 2;
    c.ffn_dim = 48;
    c.tie_embeddings = false;
    c.qkv_bias = true;
  }
  return c;
}

void init_noisy(nn::GPT& m, uint64_t seed) {
  m.initialize(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (nn::ParamGroup g : {nn::ParamGroup::Model, nn::ParamGroup::Experts}) {
    nn::ParameterSet& ps = m.params(g);
    if (ps.size() == 0) continue;
    float* w = ps.flat_params().f32();
    for (const nn::ParamInfo& p : ps.infos())
      for (int64_t i = 0; i < p.local_numel(); ++i) w[p.offset + i] += d(rng);
  }
}

struct GenerateCase {
  std::string name;
  nn::GPTConfig cfg;
  bool can_decode = true;
};

void PrintTo(const GenerateCase& c, std::ostream* os) {
  *os << c.name;
}

class GenerateWithCache : public ::testing::TestWithParam<GenerateCase> {};

TEST_P(GenerateWithCache, SameTokensAsTheFullForwardThroughTheSlidingWindow) {
  const GenerateCase& k = GetParam();
  Allocator alloc("generate");
  nn::GPT m(k.cfg, 1, alloc);
  init_noisy(m, 21);
  EXPECT_EQ(m.can_decode(), k.can_decode) << m.decode_unsupported();
  const int block = k.cfg.block_size, N = 40;
  // A short prompt (the cache fills after block - 5 tokens), and one longer than block_size.
  for (int prompt_len : {5, block + 4}) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < prompt_len; ++i) prompt.push_back((7 * i + 3) % k.cfg.vocab_size);
    for (uint64_t seed : {1u, 2u}) {
      SampleOptions opt{N, 0.8f, 20, seed};
      SampleStats cached, full;
      std::vector<int32_t> streamed;
      const std::vector<int32_t> a = generate(
          m, prompt, opt, [&](int32_t t) { streamed.push_back(t); }, &cached);
      opt.kv_cache = false;
      const std::vector<int32_t> b = generate(m, prompt, opt, {}, &full);
      ASSERT_EQ(a.size(), static_cast<size_t>(N));
      EXPECT_EQ(a, b) << k.name << ", prompt of " << prompt_len << ", seed " << seed;
      EXPECT_EQ(streamed, a);
      EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 3u) << "sampling should vary";
      EXPECT_EQ(cached.kv_cache, k.can_decode);
      EXPECT_FALSE(full.kv_cache);
      const int64_t window = std::min(block, prompt_len);
      EXPECT_EQ(cached.prefill_tokens, window);
      EXPECT_EQ(full.prefill_tokens, window);
      EXPECT_EQ(cached.decode_tokens, N - 1);
      // One decode step per token while the cache has room, then a prefill of the window each.
      const int64_t steps_with_room = block - window;
      EXPECT_EQ(cached.window_prefills, k.can_decode ? N - 1 - steps_with_room : 0);
      EXPECT_EQ(full.window_prefills, 0);
    }
  }
}

std::vector<GenerateCase> generate_cases() {
  std::vector<GenerateCase> v;
  v.push_back({"gpt2", small(nn::Arch::Gpt2)});
  nn::GPTConfig moe = small(nn::Arch::Gpt2);
  moe.moe.experts = 4;
  moe.moe.top_k = 2;
  v.push_back({"gpt2_moe", moe});
  v.push_back({"llama_gqa_untied", small(nn::Arch::Llama)});
  moe.moe.capacity_factor = 1.0f;  // cannot decode: the full forward
  v.push_back({"gpt2_moe_with_capacity", moe, false});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Families, GenerateWithCache, ::testing::ValuesIn(generate_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tessera::train
