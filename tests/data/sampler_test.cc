#include "tessera/data/sampler.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "tessera/core/error.h"
#include "tessera/data/dataset.h"
#include "tessera/data/eval_windows.h"

namespace tessera::data {
namespace {

// Token i has id i (mod 65536), so a window's content reveals its start.
std::shared_ptr<const TokenSource> iota_tokens(int64_t n) {
  std::vector<uint32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), 0u);
  return std::make_shared<TokenVector>(std::move(t), "iota");
}

std::vector<int64_t> epoch_starts(WindowSampler& s, int64_t epoch) {
  std::vector<int64_t> v;
  for (int64_t k = 0; k < s.windows_per_epoch(); ++k) v.push_back(s.window_start(epoch, k));
  return v;
}

TEST(Split, LastFractionIsValidation) {
  auto s = split_train_val(1000, 0.1);
  EXPECT_EQ(s.train, (TokenRange{0, 900}));
  EXPECT_EQ(s.validation, (TokenRange{900, 1000}));
  s = split_train_val(1000, 0.0);
  EXPECT_EQ(s.train, (TokenRange{0, 1000}));
  EXPECT_EQ(s.validation.size(), 0);
  EXPECT_THROW(split_train_val(1000, 1.0), ConfigError);
  EXPECT_THROW(split_train_val(1000, -0.1), ConfigError);
  EXPECT_THROW(split_train_val(1000, 0.01, 65), ConfigError);  // 10 validation tokens < 65
}

TEST(Sampler, SameSeedAndEpochGiveSameOrder) {
  auto tokens = iota_tokens(10007);
  WindowSampler a(tokens, {0, 10007}, {.seq_len = 16, .seed = 1234});
  WindowSampler b(tokens, {0, 10007}, {.seq_len = 16, .seed = 1234});
  WindowSampler c(tokens, {0, 10007}, {.seq_len = 16, .seed = 99});
  EXPECT_EQ(a.windows_per_epoch(), (10007 - 1) / 16);
  EXPECT_EQ(epoch_starts(a, 3), epoch_starts(b, 3));
  EXPECT_EQ(epoch_starts(a, 0), epoch_starts(b, 0));
  EXPECT_NE(epoch_starts(a, 0), epoch_starts(a, 1));
  EXPECT_NE(epoch_starts(a, 0), epoch_starts(c, 0));
}

TEST(Sampler, EveryWindowOncePerEpoch) {
  auto tokens = iota_tokens(5000);
  const TokenRange range{100, 4100};
  WindowSampler s(tokens, range, {.seq_len = 7, .seed = 5});
  const int64_t W = s.windows_per_epoch();
  EXPECT_EQ(W, (4000 - 1) / 7);
  std::set<int64_t> offsets;
  for (int64_t e = 0; e < 6; ++e) {
    const int64_t off = s.epoch_offset(e);
    offsets.insert(off);
    ASSERT_GE(off, 0);
    ASSERT_LE(off, (4000 - 1) % 7);
    std::set<int64_t> seen;
    for (int64_t start : epoch_starts(s, e)) {
      ASSERT_EQ((start - range.begin - off) % 7, 0);
      ASSERT_GE(start, range.begin);
      ASSERT_LE(start + 7 + 1, range.end);
      seen.insert(start);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), W);
  }
  EXPECT_GT(offsets.size(), 1u);  // the offset changes between epochs
  WindowSampler fixed(tokens, range, {.seq_len = 7, .seed = 5, .random_offset = false});
  EXPECT_EQ(fixed.epoch_offset(3), 0);
}

TEST(Sampler, BatchesHoldTheWindowsAndTargetsShiftByOne) {
  auto tokens = iota_tokens(1000);
  WindowSampler s(tokens, {0, 1000}, {.seq_len = 8, .seed = 1});
  const int B = 4, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  s.next_batch(B, 0, B, in.data(), tg.data());
  for (int r = 0; r < B; ++r) {
    const int64_t start = s.window_start(0, r);
    for (int t = 0; t < T; ++t) {
      ASSERT_EQ(in[static_cast<std::size_t>(r * T + t)], start + t);
      ASSERT_EQ(tg[static_cast<std::size_t>(r * T + t)], start + t + 1);
    }
  }
  EXPECT_EQ(s.position(), (SamplerPosition{0, 4}));
}

TEST(Sampler, ResumeFromSavedPositionContinuesIdentically) {
  auto tokens = iota_tokens(3001);
  const int B = 5, T = 16;  // 187 windows per epoch: batches cross epoch boundaries
  WindowSampler full(tokens, {0, 3001}, {.seq_len = T, .seed = 77});
  std::vector<int32_t> in(B * T), tg(B * T);
  std::vector<std::vector<int32_t>> reference;
  SamplerPosition saved;
  for (int step = 0; step < 100; ++step) {
    if (step == 60) saved = full.position();
    full.next_batch(B, 0, B, in.data(), tg.data());
    reference.push_back(in);
  }
  EXPECT_GE(full.position().epoch, 2);
  WindowSampler resumed(tokens, {0, 3001}, {.seq_len = T, .seed = 77});
  resumed.set_position(saved);
  for (int step = 60; step < 100; ++step) {
    resumed.next_batch(B, 0, B, in.data(), tg.data());
    ASSERT_EQ(in, reference[static_cast<std::size_t>(step)]) << "step " << step;
  }
  EXPECT_EQ(resumed.position(), full.position());
  EXPECT_THROW(resumed.set_position({0, 187}), ConfigError);
}

TEST(Sampler, RowSubRangesEqualRowsOfTheFullBatch) {
  auto tokens = iota_tokens(2000);
  const int B = 8, T = 10;
  WindowSampler one(tokens, {0, 2000}, {.seq_len = T, .seed = 3});
  for (int dp : {1, 2, 4, 8}) {
    std::vector<WindowSampler> ranks;
    for (int r = 0; r < dp; ++r)
      ranks.emplace_back(tokens, TokenRange{0, 2000}, SamplerOptions{.seq_len = T, .seed = 3});
    WindowSampler ref(tokens, {0, 2000}, {.seq_len = T, .seed = 3});
    for (int step = 0; step < 30; ++step) {
      std::vector<int32_t> in(B * T), tg(B * T);
      ref.next_batch(B, 0, B, in.data(), tg.data());
      for (int r = 0; r < dp; ++r) {
        const int lo = r * B / dp, hi = (r + 1) * B / dp;
        std::vector<int32_t> rin((hi - lo) * T), rtg((hi - lo) * T);
        ranks[static_cast<std::size_t>(r)].next_batch(B, lo, hi, rin.data(), rtg.data());
        ASSERT_TRUE(std::equal(rin.begin(), rin.end(), in.begin() + lo * T));
        ASSERT_TRUE(std::equal(rtg.begin(), rtg.end(), tg.begin() + lo * T));
      }
    }
  }
}

TEST(Sampler, TooLittleDataIsConfigError) {
  auto tokens = iota_tokens(10);
  EXPECT_THROW(WindowSampler(tokens, {0, 10}, {.seq_len = 10}), ConfigError);
  EXPECT_NO_THROW(WindowSampler(tokens, {0, 10}, {.seq_len = 9}));
}

TEST(EvalWindows, ConsecutiveWindowsLastPartialDropped) {
  auto tokens = iota_tokens(100);
  const TokenRange range{10, 60};  // 50 tokens: (50 - 1) / 8 = 6 windows
  EvalWindows ev(tokens, range, 8);
  EXPECT_EQ(ev.num_windows(), 6);
  EXPECT_EQ(ev.num_batches(4), 2);
  std::vector<int32_t> in(4 * 8), tg(4 * 8);
  EXPECT_EQ(ev.fetch_batch(0, 4, in.data(), tg.data()), 4);
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(in[static_cast<std::size_t>(i * 8 + t)], 10 + i * 8 + t);
      EXPECT_EQ(tg[static_cast<std::size_t>(i * 8 + t)], 10 + i * 8 + t + 1);
    }
  EXPECT_EQ(ev.fetch_batch(1, 4, in.data(), tg.data()), 2);
  EXPECT_EQ(in[0], 10 + 4 * 8);
  EXPECT_EQ(tg[2 * 8 - 1], 10 + 6 * 8);  // last target: 58 < 60
  EXPECT_THROW(ev.fetch_batch(2, 4, in.data(), tg.data()), Error);
  // Exactly k*T + 1 tokens make k full windows.
  EXPECT_EQ(EvalWindows(tokens, {0, 17}, 8).num_windows(), 2);
  EXPECT_EQ(EvalWindows(tokens, {0, 16}, 8).num_windows(), 1);
  EXPECT_EQ(EvalWindows(tokens, {0, 8}, 8).num_windows(), 0);
}

}  // namespace
}  // namespace tessera::data
