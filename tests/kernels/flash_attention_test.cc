// The fused attention (kernels/flash_attention.h) against a float64 reference written here from
// the header's contract: values (out, lse) and gradients (dq, dk, dv), causal by positions or not,
// dropout at global coordinates, grouped-query heads, tile edges, permuted (load-balanced)
// positions, a query subset against all keys, merging blocks of keys (ring attention), backward
// over key blocks, thread-count independence and the bf16 GEMM mode. Rows carry padding (strides
// wider than the heads) so that every stride is honoured.
#include "tessera/kernels/flash_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "compute_threads.h"
#include "grad_check.h"
#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/precision.h"

namespace tessera::kernels {
namespace {

using testing::randn;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using tessera::testing::ComputeThreads;

// One attention problem: q[B * Tq, ldq] (query head h at column h * hs), kv[B * Tk, ldkv] (key
// head g at column g * hs, value head g at KV * hs + g * hs), dout laid out as out[B * Tq, ldo].
struct Problem {
  int B = 1, Tq = 1, Tk = 1, NH = 1, KV = 1, hs = 8;
  std::vector<int64_t> qpos, kpos;  // empty: 0, 1, ...
  bool causal = true;
  AttentionDropout drop;
  int64_t ldq = 0, ldkv = 0, ldo = 0;
  std::vector<float> q, kv, dout;

  Problem(int B_, int Tq_, int Tk_, int NH_, int KV_, int hs_, uint32_t seed = 1)
      : B(B_), Tq(Tq_), Tk(Tk_), NH(NH_), KV(KV_), hs(hs_) {
    ldq = int64_t{NH} * hs + 3;
    ldkv = 2 * int64_t{KV} * hs + 5;
    ldo = int64_t{NH} * hs + 1;
    q = randn(static_cast<size_t>(int64_t{B} * Tq * ldq), seed);
    kv = randn(static_cast<size_t>(int64_t{B} * Tk * ldkv), seed + 1);
    dout = randn(static_cast<size_t>(int64_t{B} * Tq * ldo), seed + 2);
  }
  FlashAttention call() const {
    FlashAttention a;
    a.B = B;
    a.Tq = Tq;
    a.Tk = Tk;
    a.heads = AttentionHeads{NH, KV, hs};
    a.q = q.data();
    a.ldq = ldq;
    a.k = kv.data();
    a.v = kv.data() + int64_t{KV} * hs;
    a.ldkv = ldkv;
    a.q_pos = qpos.empty() ? nullptr : qpos.data();
    a.k_pos = kpos.empty() ? nullptr : kpos.data();
    a.causal = causal;
    a.drop = drop;
    return a;
  }
  int64_t qp(int i) const { return qpos.empty() ? i : qpos[i]; }
  int64_t kp(int j) const { return kpos.empty() ? j : kpos[j]; }
};

struct Result {
  std::vector<float> out, lse, dq, dkv;
};

// Forward, delta and backward of one call (gradients zeroed first).
Result run(const Problem& p) {
  Result r;
  r.out.assign(static_cast<size_t>(int64_t{p.B} * p.Tq * p.ldo), 0.0f);
  r.lse.assign(static_cast<size_t>(int64_t{p.B} * p.NH * p.Tq), 123.0f);
  const FlashAttention a = p.call();
  flash_attention_forward(a, r.out.data(), p.ldo, r.lse.data());
  std::vector<float> delta(r.lse.size(), 7.0f);
  flash_attention_delta(delta.data(), r.out.data(), p.ldo, p.dout.data(), p.ldo, p.B, p.Tq,
                        a.heads);
  r.dq.assign(p.q.size(), 0.0f);
  r.dkv.assign(p.kv.size(), 0.0f);
  flash_attention_backward(a, p.dout.data(), p.ldo, r.lse.data(), delta.data(), r.dq.data(), p.ldq,
                           r.dkv.data(), r.dkv.data() + int64_t{p.KV} * p.hs, p.ldkv);
  return r;
}

struct Reference {
  std::vector<double> out, lse, dq, dkv;
};

// The float64 reference from the header's contract, plain loops.
Reference reference(const Problem& p) {
  Reference r;
  r.out.assign(static_cast<size_t>(int64_t{p.B} * p.Tq * p.ldo), 0.0);
  r.lse.assign(static_cast<size_t>(int64_t{p.B} * p.NH * p.Tq), 0.0);
  r.dq.assign(p.q.size(), 0.0);
  r.dkv.assign(p.kv.size(), 0.0);
  const int G = p.NH / p.KV, hs = p.hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const double p_drop = p.drop.p;
  const int64_t nhg = p.drop.n_head_global > 0 ? p.drop.n_head_global : p.NH;
  const int64_t L = p.drop.seq_len > 0 ? p.drop.seq_len : p.Tq;
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.NH; ++h) {
      const int g = h / G;
      for (int i = 0; i < p.Tq; ++i) {
        const float* qi = p.q.data() + (int64_t{b} * p.Tq + i) * p.ldq + h * hs;
        const float* go = p.dout.data() + (int64_t{b} * p.Tq + i) * p.ldo + h * hs;
        std::vector<int> seen;
        std::vector<double> s, keep;
        for (int j = 0; j < p.Tk; ++j) {
          if (p.causal && p.kp(j) > p.qp(i)) continue;
          const float* kj = p.kv.data() + (int64_t{b} * p.Tk + j) * p.ldkv + g * hs;
          double d = 0;
          for (int e = 0; e < hs; ++e) d += static_cast<double>(qi[e]) * kj[e];
          seen.push_back(j);
          s.push_back(d * scale);
          double f = 1.0;
          if (p_drop > 0) {
            const uint64_t idx =
                ((static_cast<uint64_t>(p.drop.first_sample + b) * nhg + p.drop.head_offset + h) *
                     L +
                 p.qp(i)) *
                    L +
                p.kp(j);
            f = philox_uniform(p.drop.seed, p.drop.stream, idx) > p.drop.p ? 1.0 / (1.0 - p_drop)
                                                                           : 0.0;
          }
          keep.push_back(f);
        }
        double& lse = r.lse[(int64_t{b} * p.NH + h) * p.Tq + i];
        if (seen.empty()) {
          lse = -std::numeric_limits<double>::infinity();
          continue;
        }
        double mx = -1e300, z = 0;
        for (double x : s) mx = std::max(mx, x);
        for (double x : s) z += std::exp(x - mx);
        lse = mx + std::log(z);
        std::vector<double> P(s.size()), dP(s.size());
        double dot = 0;
        for (size_t n = 0; n < s.size(); ++n) {
          P[n] = std::exp(s[n] - lse);
          const float* vj =
              p.kv.data() + (int64_t{b} * p.Tk + seen[n]) * p.ldkv + int64_t{p.KV} * hs + g * hs;
          double dpd = 0;
          for (int e = 0; e < hs; ++e) {
            r.out[(int64_t{b} * p.Tq + i) * p.ldo + h * hs + e] += P[n] * keep[n] * vj[e];
            dpd += static_cast<double>(go[e]) * vj[e];
          }
          dP[n] = dpd * keep[n];
          dot += P[n] * dP[n];
        }
        for (size_t n = 0; n < s.size(); ++n) {
          const int64_t row = int64_t{b} * p.Tk + seen[n];
          const float* kj = p.kv.data() + row * p.ldkv + g * hs;
          const double ds = P[n] * (dP[n] - dot) * scale;
          for (int e = 0; e < hs; ++e) {
            r.dq[(int64_t{b} * p.Tq + i) * p.ldq + h * hs + e] += ds * kj[e];
            r.dkv[row * p.ldkv + g * hs + e] += ds * qi[e];
            r.dkv[row * p.ldkv + int64_t{p.KV} * hs + g * hs + e] += P[n] * keep[n] * go[e];
          }
        }
      }
    }
  return r;
}

// |got - want| <= atol + rtol |want| everywhere; -inf only where -inf is wanted.
template <class Want>
void expect_close(const std::vector<float>& got, const std::vector<Want>& want, double atol,
                  double rtol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      ASSERT_EQ(static_cast<double>(got[i]), static_cast<double>(want[i]))
          << what << "[" << i << "]";
      continue;
    }
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(static_cast<double>(want[i])))
        << what << "[" << i << "]";
  }
}

void expect_matches_reference(const Problem& p, double atol = 2e-5) {
  const Result got = run(p);
  const Reference want = reference(p);
  expect_close(got.out, want.out, atol, 1e-4, "out");
  expect_close(got.lse, want.lse, atol, 1e-5, "lse");
  expect_close(got.dq, want.dq, atol, 1e-4, "dq");
  expect_close(got.dkv, want.dkv, atol, 1e-4, "dk, dv");
}

struct Case {
  int B, Tq, Tk, NH, KV, hs;
  bool causal;
  float p;
};

class FlashAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttentionTest, MatchesTheFloat64Reference) {
  const Case c = GetParam();
  Problem p(c.B, c.Tq, c.Tk, c.NH, c.KV, c.hs, 5);
  p.causal = c.causal;
  p.drop = AttentionDropout{c.p, 99, 1234, 3, 1, c.NH + 2};
  expect_matches_reference(p);
}

// hs 16 and 64: key tiles of 64; hs 128: key tiles of 32 (query tiles are 64 rows; the last case
// has two backward blocks of key tiles).
INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionTest,
    ::testing::Values(Case{1, 1, 1, 1, 1, 16, true, 0}, Case{2, 63, 63, 2, 2, 16, true, 0},
                      Case{1, 64, 64, 2, 1, 16, true, 0}, Case{1, 65, 65, 2, 2, 16, true, 0},
                      Case{2, 131, 131, 4, 2, 16, true, 0}, Case{1, 131, 131, 4, 1, 16, true, 0},
                      Case{1, 70, 70, 2, 2, 64, true, 0}, Case{1, 70, 70, 1, 1, 128, true, 0},
                      Case{2, 65, 131, 2, 2, 16, false, 0}, Case{1, 131, 33, 4, 2, 16, false, 0},
                      Case{2, 65, 65, 4, 2, 16, true, 0.2f},
                      Case{1, 131, 131, 2, 1, 16, false, 0.3f}, Case{2, 0, 5, 2, 2, 16, true, 0},
                      Case{1, 70, 300, 1, 1, 128, false, 0}));

// More tiles than one forward piece (8 query tiles) and one backward block (8 key tiles) hold:
// queries at positions 70..599 against keys 0..599.
TEST(FlashAttention, ManyTiles) {
  Problem p(1, 530, 600, 2, 1, 16, 30);
  for (int i = 0; i < p.Tq; ++i) p.qpos.push_back(70 + i);
  p.drop = AttentionDropout{0.1f, 7, 8, 0, 0, 0, 600};
  expect_matches_reference(p);
}

// The load-balanced layout of context parallelism: the sequence in 2N chunks, rank r holding
// chunks r and 2N-1-r; here the queries of rank r against all T keys (all-gathered), with dropout
// at the single-device coordinates (seq_len = T).
TEST(FlashAttention, LoadBalancedQueryChunksAgainstAllKeys) {
  const int T = 200, N = 2, chunk = T / (2 * N);
  for (int rank = 0; rank < N; ++rank) {
    Problem p(2, 2 * chunk, T, 4, 2, 16, 40 + rank);
    for (int c : {rank, 2 * N - 1 - rank})
      for (int t = 0; t < chunk; ++t) p.qpos.push_back(int64_t{c} * chunk + t);
    p.drop = AttentionDropout{0.1f, 7, 8, 0, 0, 0, T};
    expect_matches_reference(p);
  }
}

// Positions in the permuted order of the load-balanced layout for queries and keys alike (the
// causal mask by position, tiles whose positions are not in order).
TEST(FlashAttention, PermutedPositions) {
  const int T = 150, N = 3, chunk = T / (2 * N);
  Problem p(1, T, T, 2, 2, 16, 50);
  for (int r = 0; r < N; ++r)
    for (int c : {r, 2 * N - 1 - r})
      for (int t = 0; t < chunk; ++t) p.qpos.push_back(int64_t{c} * chunk + t);
  p.kpos = p.qpos;
  expect_matches_reference(p);
}

// Queries that see no key: out 0, lse -inf, zero gradients, nothing NaN. The keys start at the
// last position of the first query tile (63): that tile pair is seen by one query only.
TEST(FlashAttention, RowsThatSeeNoKey) {
  Problem p(1, 70, 40, 2, 1, 16, 60);
  for (int j = 0; j < p.Tk; ++j) p.kpos.push_back(63 + j);  // queries 0..62 see nothing
  expect_matches_reference(p);
  const Result r = run(p);
  for (int i = 0; i < 63; ++i) {
    EXPECT_EQ(r.lse[i], kNegInf);
    for (int e = 0; e < 2 * 16; ++e) EXPECT_EQ(r.out[i * p.ldo + e], 0.0f);
    for (int e = 0; e < 2 * 16; ++e) EXPECT_EQ(r.dq[i * p.ldq + e], 0.0f);
  }
}

// The materialising kernel's dropped output and gradients, on its packed qkv layout.
TEST(FlashAttention, DropoutIsTheMaterialisingKernels) {
  const int B = 2, T = 131;
  const AttentionHeads heads{4, 2, 16};
  const int W = heads.row_width(), C = heads.q * heads.size;
  const auto qkv = randn(static_cast<size_t>(B) * T * W, 70);
  const auto dout = randn(static_cast<size_t>(B) * T * C, 71);
  const AttentionDropout drop{0.25f, 5, 6, 2, 1, 6};
  std::vector<float> want(static_cast<size_t>(B) * T * C), att(static_cast<size_t>(B) * 4 * T * T),
      att_drop(att.size()), want_grad(qkv.size()), scratch(static_cast<size_t>(T) * T);
  attention_forward(want.data(), att.data(), att_drop.data(), qkv.data(), B, T, heads, &drop);
  attention_backward(want_grad.data(), scratch.data(), dout.data(), att.data(), att_drop.data(),
                     qkv.data(), B, T, heads, drop.p);
  FlashAttention a;
  a.B = B;
  a.Tq = a.Tk = T;
  a.heads = heads;
  a.q = qkv.data();
  a.ldq = W;
  a.k = qkv.data() + C;
  a.v = qkv.data() + C + heads.kv * heads.size;
  a.ldkv = W;
  a.drop = drop;
  std::vector<float> out(want.size()), lse(static_cast<size_t>(B) * 4 * T), delta(lse.size());
  flash_attention_forward(a, out.data(), C, lse.data());
  expect_close(out, want, 1e-5, 1e-5, "out");
  flash_attention_delta(delta.data(), out.data(), C, dout.data(), C, B, T, heads);
  std::vector<float> grad(qkv.size(), 0.0f);
  flash_attention_backward(a, dout.data(), C, lse.data(), delta.data(), grad.data(), W,
                           grad.data() + C, grad.data() + C + heads.kv * heads.size, W);
  expect_close(grad, want_grad, 2e-5, 1e-4, "dqkv");
}

// The keys of [j0, j1) of every sequence, as a [B, j1 - j0, ldkv] buffer of their own.
std::vector<float> key_block(const Problem& p, const std::vector<float>& kv, int j0, int j1) {
  std::vector<float> r;
  for (int b = 0; b < p.B; ++b)
    r.insert(r.end(), kv.begin() + (int64_t{b} * p.Tk + j0) * p.ldkv,
             kv.begin() + (int64_t{b} * p.Tk + j1) * p.ldkv);
  return r;
}

// Ring attention: the keys in blocks, visited in some order, merged into out and lse, equal one
// call; then the backward block by block (the whole attention's lse and delta) sums to the one
// call's gradients.
TEST(FlashAttention, MergingKeyBlocksIsOneCall) {
  struct Split {
    std::vector<int> bounds, order;
    bool causal;
    float p;
  };
  for (const Split& split :
       {Split{{0, 64, 131}, {0, 1}, true, 0.0f}, Split{{0, 50, 90, 131}, {2, 0, 1}, true, 0.0f},
        Split{{0, 50, 90, 131}, {1, 2, 0}, false, 0.0f}, Split{{0, 40, 131}, {1, 0}, true, 0.2f}}) {
    Problem p(2, 131, 131, 4, 2, 16, 80);
    p.causal = split.causal;
    p.drop = AttentionDropout{split.p, 3, 4, 0, 0, 0};
    std::vector<int64_t> all(p.Tk);
    std::iota(all.begin(), all.end(), 0);
    const Result one = run(p);
    std::vector<float> out(one.out.size(), 0.0f), lse(one.lse.size(), 0.0f);
    std::vector<std::vector<float>> blocks;
    auto block_call = [&](int n) {
      const int j0 = split.bounds[n], j1 = split.bounds[n + 1];
      FlashAttention a = p.call();
      a.Tk = j1 - j0;
      a.k = blocks[n].data();
      a.v = blocks[n].data() + int64_t{p.KV} * p.hs;
      a.k_pos = all.data() + j0;
      return a;
    };
    for (size_t n = 0; n + 1 < split.bounds.size(); ++n)
      blocks.push_back(key_block(p, p.kv, split.bounds[n], split.bounds[n + 1]));
    bool first = true;
    for (int n : split.order) {
      flash_attention_forward(block_call(n), out.data(), p.ldo, lse.data(), !first);
      first = false;
    }
    expect_close(out, one.out, 1e-5, 1e-5, "merged out");
    expect_close(lse, one.lse, 1e-5, 1e-6, "merged lse");
    std::vector<float> delta(lse.size()), dq(p.q.size(), 0.0f), dkv(p.kv.size(), 0.0f);
    flash_attention_delta(delta.data(), out.data(), p.ldo, p.dout.data(), p.ldo, p.B, p.Tq,
                          p.call().heads);
    for (int n : split.order) {
      const int j0 = split.bounds[n], j1 = split.bounds[n + 1];
      std::vector<float> g(blocks[n].size(), 0.0f);
      flash_attention_backward(block_call(n), p.dout.data(), p.ldo, lse.data(), delta.data(),
                               dq.data(), p.ldq, g.data(), g.data() + int64_t{p.KV} * p.hs, p.ldkv);
      for (int b = 0; b < p.B; ++b)
        std::copy(g.begin() + int64_t{b} * (j1 - j0) * p.ldkv,
                  g.begin() + int64_t{b + 1} * (j1 - j0) * p.ldkv,
                  dkv.begin() + (int64_t{b} * p.Tk + j0) * p.ldkv);
    }
    expect_close(dq, one.dq, 1e-5, 1e-4, "dq over blocks");
    expect_close(dkv, one.dkv, 1e-5, 1e-4, "dk, dv over blocks");
  }
}

// Pieces compute their outputs alone in a fixed order: any thread count gives the same bits.
TEST(FlashAttention, BitwiseTheSameOnAnyThreadCount) {
  for (float drop : {0.0f, 0.2f}) {
    Problem p(2, 200, 200, 4, 2, 16, 90);
    p.drop = AttentionDropout{drop, 1, 2, 0, 0, 0};
    Result one;
    {
      ComputeThreads t(1);
      one = run(p);
    }
    for (int threads : {2, 3, 5}) {
      ComputeThreads t(threads);
      const Result r = run(p);
      EXPECT_EQ(0, std::memcmp(r.out.data(), one.out.data(), one.out.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(r.lse.data(), one.lse.data(), one.lse.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(r.dq.data(), one.dq.data(), one.dq.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(r.dkv.data(), one.dkv.data(), one.dkv.size() * sizeof(float)));
    }
  }
}

int threads_in_process() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

// The tile GEMMs run in fp32 whatever the caller's GEMM mode: under bf16 every tile would round
// both of its operands first, and through oneDNN each tile GEMM started an OpenMP team of the
// rank's size from every piece's thread (a bf16 step on two threads took 1.5x as long; bf16
// tiles on one thread 1.7x as long as fp32 ones). So the bf16 mode's result is bitwise fp32's,
// and a fresh rank thread that runs the attention in it starts no OpenMP thread.
TEST(FlashAttention, TileGemmsRunInFp32InEveryGemmMode) {
  ComputeThreads t(2);
  const Problem p(2, 131, 131, 4, 2, 16, 100);
  const Result fp32 = run(p);
  for (const Bf16Gemm path : {Bf16Gemm::Auto, Bf16Gemm::Emulated, Bf16Gemm::OneDnn}) {
    if (path == Bf16Gemm::OneDnn && !onednn_bf16_usable()) continue;
    SCOPED_TRACE(to_string(path));
    int before = -1, after = -1;
    Result bf16;
    std::thread rank([&] {
      GemmModeScope mode(GemmMode{Precision::BF16, path});
      before = threads_in_process();
      bf16 = run(p);
      after = threads_in_process();
    });
    rank.join();
    ASSERT_GT(before, 0);
    EXPECT_EQ(after, before);
    EXPECT_EQ(bf16.out, fp32.out);
    EXPECT_EQ(bf16.lse, fp32.lse);
    EXPECT_EQ(bf16.dq, fp32.dq);
    EXPECT_EQ(bf16.dkv, fp32.dkv);
  }
}

TEST(FlashAttention, RejectsKeyValueHeadsNotDividingQueryHeads) {
  Problem p(1, 4, 4, 4, 3, 8, 1);
  FlashAttention a = p.call();
  a.heads = AttentionHeads{4, 3, 8};
  std::vector<float> out(100), lse(100);
  EXPECT_THROW(flash_attention_forward(a, out.data(), 32, lse.data()), ShapeError);
}

}  // namespace
}  // namespace tessera::kernels
