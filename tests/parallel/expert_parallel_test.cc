// Expert parallelism at the layer level: an MoE MLP whose experts are split over n thread ranks,
// each rank routing its own tokens, against one rank holding every expert and all the tokens.
// Outputs and input gradients per token, the router's gradient summed over the ranks, and each
// expert's gradient on the rank that holds it; with capacity dropping, with all tokens sent to
// the experts of one rank (the others receive nothing), and with uneven routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"
#include "tessera/core/philox.h"
#include "tessera/nn/moe.h"

namespace tessera::nn {
namespace {

struct LayerRun {
  std::vector<float> out, dx;                      // [rows of this rank's tokens, C]
  std::map<std::string, std::vector<float>> grad;  // by global name
  MoeStats stats;
};

GPTConfig config(float capacity) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 5;
  c.vocab_size = 11;
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.capacity_factor = capacity;
  c.moe.aux_loss = 0.2f;
  c.moe.z_loss = 0.05f;
  return c;
}

// Initialisation plus noise keyed by the parameter's name, so every rank draws the same values
// for the same global tensor. `skew` > 0 makes experts 0 and 1 win every token (feature 0 of
// every input is large, and only their router columns read it).
void init(ParameterSet& ps, bool skew) {
  ps.initialize(3);
  for (int i = 0; i < ps.size(); ++i) {
    const ParamInfo& info = ps.infos()[i];
    float* w = ps.param_data(i);
    const bool router = info.name.find("router") != std::string::npos;
    for (int64_t j = 0; j < info.local_numel(); ++j)
      w[j] += (router ? 0.5f : 0.05f) * philox_normal(7, stable_hash(info.name), j);
    if (router && skew) {
      const int64_t E = info.global_shape[1];
      for (int64_t e = 0; e < E; ++e) w[e] = e < 2 ? 3.0f : 0.0f;  // row 0 = feature 0
    }
  }
}

std::vector<float> tokens_of(int rank, int rows, int C, bool skew) {
  std::mt19937 rng(100 + rank);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows) * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = d(rng) + (skew && i % C == 0 ? 6.0f : 0.0f);
  return x;
}

// One rank's layer: B sequences (its own tokens x, output gradient dout) through the MoE MLP,
// after sleeping `late` before the forward and before the backward.
LayerRun run_layer(const GPTConfig& cfg, ExpertSplit split, const std::vector<float>& x,
                   const std::vector<float>& dout, int B, bool skew,
                   std::chrono::milliseconds late = {}) {
  Allocator alloc("test");
  ParameterSet ps, eps;
  MixtureOfExperts moe(ps, eps, cfg, 1, split);
  ps.materialize(alloc);
  eps.materialize(alloc);
  init(ps, skew);
  init(eps, skew);
  MixtureOfExperts::Record rec = moe.make_record(B, alloc);
  MixtureOfExperts::Workspace ws = MixtureOfExperts::make_workspace(alloc);
  LayerRun r;
  r.out.resize(x.size());
  r.dx.resize(x.size());
  std::this_thread::sleep_for(late);
  moe.forward(x.data(), r.out.data(), B, cfg.block_size, 0.25f, rec, ws, true);
  std::this_thread::sleep_for(late);
  moe.backward(rec, dout.data(), r.dx.data(), ws);
  for (const ParameterSet* s : {&ps, &eps})
    for (int i = 0; i < s->size(); ++i) r.grad[s->infos()[i].name] = s->grad(i).to_vector();
  r.stats = moe.stats();
  return r;
}

void expect_near(const std::vector<float>& got, const float* want, size_t n, double scale,
                 const std::string& what) {
  ASSERT_EQ(got.size(), n) << what;
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << what << "[" << i << "]";
}

double max_abs(const std::vector<float>& v) {
  double m = 1e-6;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

struct Case {
  int ranks;
  float capacity;
  bool skew;
};

class ExpertParallelLayer : public ::testing::TestWithParam<Case> {};

TEST_P(ExpertParallelLayer, EqualsOneRankWithAllExperts) {
  const Case k = GetParam();
  const GPTConfig cfg = config(k.capacity);
  const int B = 2, T = cfg.block_size, C = cfg.n_embd, n = k.ranks;
  const size_t rows = static_cast<size_t>(B) * T * C;
  std::vector<float> x_all, d_all;
  for (int r = 0; r < n; ++r) {
    const auto x = tokens_of(r, B * T, C, k.skew), d = tokens_of(50 + r, B * T, C, false);
    x_all.insert(x_all.end(), x.begin(), x.end());
    d_all.insert(d_all.end(), d.begin(), d.end());
  }
  const auto one = comm::one_rank();
  const LayerRun ref = run_layer(cfg, ExpertSplit{*one}, x_all, d_all, B * n, k.skew);
  if (k.capacity > 0) {
    EXPECT_GT(ref.stats.dropped, 0) << "the case should drop tokens";
  }
  if (k.skew) {
    EXPECT_EQ(ref.stats.load[0] + ref.stats.load[1], ref.stats.assignments);
  }
  std::vector<LayerRun> got(static_cast<size_t>(n));
  comm::run_inproc(n, [&](comm::Communicator& world) {
    const int r = world.rank();
    std::vector<float> x(x_all.begin() + r * rows, x_all.begin() + (r + 1) * rows);
    std::vector<float> d(d_all.begin() + r * rows, d_all.begin() + (r + 1) * rows);
    got[static_cast<size_t>(r)] = run_layer(cfg, ExpertSplit{world}, x, d, B, k.skew);
  });
  const double out_scale = max_abs(ref.out), dx_scale = max_abs(ref.dx);
  std::map<std::string, std::vector<float>> router_sum;
  int64_t dropped = 0;
  for (int r = 0; r < n; ++r) {
    const LayerRun& g = got[static_cast<size_t>(r)];
    expect_near(g.out, ref.out.data() + r * rows, rows, out_scale,
                "out, rank " + std::to_string(r));
    expect_near(g.dx, ref.dx.data() + r * rows, rows, dx_scale, "dx, rank " + std::to_string(r));
    dropped += g.stats.dropped;
    int experts_held = 0;
    for (const auto& [name, v] : g.grad) {
      if (name.find("router") != std::string::npos) {
        auto& s = router_sum[name];
        s.resize(v.size(), 0.0f);
        for (size_t i = 0; i < v.size(); ++i) s[i] += v[i];
        continue;
      }
      ++experts_held;  // an expert's gradient is complete on the one rank holding it
      const std::vector<float>& w = ref.grad.at(name);
      expect_near(v, w.data(), w.size(), max_abs(w), name);
    }
    EXPECT_EQ(experts_held, 4 * cfg.moe.experts / n);
  }
  EXPECT_EQ(dropped, ref.stats.dropped);
  for (const auto& [name, s] : router_sum) {
    const std::vector<float>& w = ref.grad.at(name);
    expect_near(s, w.data(), w.size(), max_abs(w), name + " summed over ranks");
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertParallelLayer,
                         ::testing::Values(Case{2, 0.0f, false}, Case{4, 0.0f, false},
                                           Case{2, 0.6f, false}, Case{4, 0.6f, false},
                                           Case{2, 0.0f, true}, Case{4, 1.0f, true}),
                         [](const auto& info) {
                           return "ep" + std::to_string(info.param.ranks) +
                                  (info.param.capacity > 0 ? "_capacity" : "_dropless") +
                                  (info.param.skew ? "_all_to_one_rank" : "");
                         });

// Each rank runs its own rows while the others' travel and the others' as soon as they arrive,
// so the order of the work depends on which rank is late; the numbers must not. Every rank's
// outputs, input gradients and weight gradients are bitwise those of the run where no rank is
// late, whichever rank is late: 4 ranks with 2 experts each, and 2 ranks with one expert each
// receiving 512 rows from each source at C = 256 (so that the local work comes in two pieces).
struct LateCase {
  int ranks, experts, T, C;
};
class ExpertParallelTiming : public ::testing::TestWithParam<LateCase> {};

TEST_P(ExpertParallelTiming, ResultsDoNotDependOnWhichRankIsLate) {
  const LateCase k = GetParam();
  GPTConfig cfg = config(0.0f);
  cfg.n_embd = k.C;
  cfg.n_head = 4;
  cfg.block_size = k.T;
  cfg.moe.experts = k.experts;
  cfg.moe.top_k = std::min(2, k.experts);
  const int B = 4, n = k.ranks, C = cfg.n_embd;
  auto run = [&](int late_rank) {
    std::vector<LayerRun> got(static_cast<size_t>(n));
    comm::run_inproc(n, [&](comm::Communicator& world) {
      const int r = world.rank();
      const auto x = tokens_of(r, B * cfg.block_size, C, false);
      const auto d = tokens_of(50 + r, B * cfg.block_size, C, false);
      got[static_cast<size_t>(r)] = run_layer(cfg, ExpertSplit{world}, x, d, B, false,
                                              std::chrono::milliseconds(r == late_rank ? 30 : 0));
    });
    return got;
  };
  const std::vector<LayerRun> ref = run(-1);
  for (int late = 0; late < n; ++late) {
    const std::vector<LayerRun> got = run(late);
    for (int r = 0; r < n; ++r) {
      const LayerRun& a = ref[static_cast<size_t>(r)];
      const LayerRun& b = got[static_cast<size_t>(r)];
      EXPECT_EQ(a.out, b.out) << "rank " << r << ", rank " << late << " late";
      EXPECT_EQ(a.dx, b.dx) << "rank " << r << ", rank " << late << " late";
      EXPECT_EQ(a.grad, b.grad) << "rank " << r << ", rank " << late << " late";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertParallelTiming,
                         ::testing::Values(LateCase{4, 8, 64, 64}, LateCase{2, 2, 128, 256}),
                         [](const auto& info) {
                           return "ep" + std::to_string(info.param.ranks) + "_E" +
                                  std::to_string(info.param.experts);
                         });

TEST(ExpertParallelLayer, ExpertsMustSplitEvenly) {
  EXPECT_THROW(comm::run_inproc(3,
                                [&](comm::Communicator& world) {
                                  ParameterSet ps, eps;
                                  MixtureOfExperts moe(ps, eps, config(0), 1, ExpertSplit{world});
                                }),
               ConfigError);
}

}  // namespace
}  // namespace tessera::nn
