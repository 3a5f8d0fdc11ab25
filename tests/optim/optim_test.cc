#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "compute_threads.h"
#include "tessera/kernels/bf16.h"
#include "tessera/optim/adamw.h"
#include "tessera/optim/grad_clip.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/optim/sgd.h"

namespace tessera::optim {
namespace {

using tessera::testing::ComputeThreads;

struct Fixture {
  Allocator alloc{"test"};
  nn::ParameterSet ps;
  // A weight "w" of w_shape with decay and a bias "b" of 5 without, then any `extra` (with decay);
  // with bf16_copies, every parameter but "b" has a bf16 copy.
  explicit Fixture(Shape w_shape = {3, 4}, std::vector<std::pair<std::string, Shape>> extra = {},
                   bool bf16_copies = false) {
    ps.add("w", std::move(w_shape), nn::Init::Normal, 0.5f, true);
    ps.add("b", {5}, nn::Init::Normal, 0.5f, false);
    for (auto& [name, shape] : extra) ps.add(name, std::move(shape), nn::Init::Normal, 0.5f, true);
    if (bf16_copies)
      for (int i = 0; i < ps.size(); ++i)
        if (ps.infos()[i].name != "b") ps.mark_gemm_weight(i);
    ps.materialize(alloc, true, true, bf16_copies);
    ps.initialize(7);
  }
  void set_grads(int step) {
    for (int i = 0; i < ps.size(); ++i) {
      float* g = ps.grad(i).f32();
      for (int64_t j = 0; j < ps.grad(i).numel(); ++j) g[j] = std::sin(0.3f * j + step + i);
    }
  }
  // Every parameter's values, in order.
  std::vector<float> values() const {
    std::vector<float> out;
    for (int i = 0; i < ps.size(); ++i)
      for (float x : ps.param(i).to_vector()) out.push_back(x);
    return out;
  }
};

// a and b bitwise equal, element by element.
void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b,
                          const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << what << " element " << i;
}

// AdamW against a double-precision transcription of the update rule.
TEST(AdamW, MatchesReferenceOverSeveralSteps) {
  Fixture f;
  AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  AdamW opt(f.ps, cfg, f.alloc);
  std::vector<std::vector<double>> p(2), m(2), v(2);
  for (int i = 0; i < 2; ++i) {
    for (float x : f.ps.param(i).to_vector()) p[i].push_back(x);
    m[i].assign(p[i].size(), 0);
    v[i].assign(p[i].size(), 0);
  }
  const double lr = 1e-2;
  for (int t = 1; t <= 5; ++t) {
    f.set_grads(t);
    opt.step(static_cast<float>(lr));
    for (int i = 0; i < 2; ++i) {
      std::vector<float> g = f.ps.grad(i).to_vector();
      double wd = i == 0 ? 0.1 : 0.0;
      for (size_t j = 0; j < p[i].size(); ++j) {
        m[i][j] = 0.9 * m[i][j] + 0.1 * g[j];
        v[i][j] = 0.95 * v[i][j] + 0.05 * g[j] * g[j];
        double mh = m[i][j] / (1 - std::pow(0.9, t)), vh = v[i][j] / (1 - std::pow(0.95, t));
        p[i][j] = p[i][j] * (1 - lr * wd) - lr * mh / (std::sqrt(vh) + 1e-8);
      }
      std::vector<float> got = f.ps.param(i).to_vector();
      for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], p[i][j], 1e-5) << i << "," << j;
    }
  }
  EXPECT_EQ(opt.steps(), 5);
  auto st = opt.state(f.ps);
  ASSERT_EQ(st.size(), 4u);
  EXPECT_EQ(st[0].first, "exp_avg.w");
  EXPECT_EQ(st[3].first, "exp_avg_sq.b");
  EXPECT_EQ(f.alloc.in_use(MemCategory::OptimizerState), 2 * 4 * static_cast<size_t>(f.ps.numel()));
}

// With more than one compute thread the step splits the segments' elements over threads (pieces
// that cut segments apart): bitwise the one-thread result, weight decay per segment included.
TEST(AdamW, ThreadedStepIsBitwiseTheOneThreadStep) {
  auto run = [](int threads) {
    Allocator alloc("test");
    nn::ParameterSet ps;
    ps.add("a", {700, 1001}, nn::Init::Normal, 0.5f, true);  // > parallel_rows' threshold
    ps.add("b", {3}, nn::Init::Normal, 0.5f, false);         // a segment a piece may cut around
    ps.add("c", {900, 777}, nn::Init::Normal, 0.5f, false);
    ps.materialize(alloc);
    ps.initialize(11);
    AdamW opt(ps, AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f}, alloc);
    const int saved = openblas_get_num_threads();
    openblas_set_num_threads(threads);
    for (int t = 1; t <= 3; ++t) {
      for (int i = 0; i < ps.size(); ++i) {
        float* g = ps.grad(i).f32();
        for (int64_t j = 0; j < ps.grad(i).numel(); ++j) g[j] = std::sin(0.001f * j + t + i);
      }
      opt.step(1e-2f);
    }
    openblas_set_num_threads(saved);
    std::vector<float> out;
    for (int i = 0; i < ps.size(); ++i)
      for (float x : ps.param(i).to_vector()) out.push_back(x);
    return out;
  };
  const std::vector<float> one = run(1), three = run(3);
  ASSERT_EQ(one.size(), three.size());
  size_t differ = 0;
  for (size_t i = 0; i < one.size(); ++i) differ += one[i] != three[i];
  EXPECT_EQ(differ, 0u);
}

TEST(SGD, MomentumAndDecay) {
  Fixture f;
  SGD opt(f.ps, SGDConfig{0.9f, 0.5f}, f.alloc);
  std::vector<float> p0 = f.ps.param(0).to_vector();
  f.set_grads(0);
  std::vector<float> g = f.ps.grad(0).to_vector();
  opt.step(0.1f);
  opt.step(0.1f);  // same gradients: buf = g, then 1.9 g
  std::vector<float> p = f.ps.param(0).to_vector();
  for (size_t j = 0; j < p.size(); ++j) {
    double x = p0[j] * 0.95 - 0.1 * g[j];
    x = x * 0.95 - 0.1 * 1.9 * g[j];
    EXPECT_NEAR(p[j], x, 1e-6);
  }
}

TEST(GradClip, ScalesToMaxNormOnlyWhenAbove) {
  Fixture f;
  f.set_grads(1);
  double n0 = std::sqrt(grad_sum_of_squares(f.ps));
  EXPECT_GT(n0, 1.0);
  double reported = clip_grad_norm(f.ps, 1.0);
  EXPECT_NEAR(reported, n0, 1e-9);
  EXPECT_NEAR(std::sqrt(grad_sum_of_squares(f.ps)), 1.0, 1e-5);
  double again = clip_grad_norm(f.ps, 10.0);  // below the limit: unchanged
  EXPECT_NEAR(again, 1.0, 1e-5);
  EXPECT_NEAR(std::sqrt(grad_sum_of_squares(f.ps)), 1.0, 1e-5);
}

// Clipping folded into the step (scale_gradients_in_next_step, as the engines clip): bitwise the
// update from gradients scaled in place first, for AdamW and SGD with momentum; the gradients are
// left as they were, and the scale holds for one step only.
TEST(GradClip, ScaleInTheStepIsBitwiseScalingInPlace) {
  auto run = [](bool in_step, bool adamw) {
    Fixture f;
    AdamW a(f.ps, AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f}, f.alloc);
    SGD s(f.ps, SGDConfig{0.9f, 0.1f}, f.alloc);
    Optimizer& opt = adamw ? static_cast<Optimizer&>(a) : s;
    std::vector<float> grads_after;
    for (int t = 1; t <= 3; ++t) {
      f.set_grads(t);
      const double norm = std::sqrt(grad_sum_of_squares(f.ps));
      const float scale = clip_scale(norm, 0.5);
      EXPECT_LT(scale, 1.0f);
      if (in_step)
        opt.scale_gradients_in_next_step(scale);
      else
        clip_to_norm(opt.segments(), norm, 0.5);
      const std::vector<float> before = f.ps.grad(0).to_vector();
      opt.step(1e-2f);
      if (in_step) {
        EXPECT_EQ(f.ps.grad(0).to_vector(), before) << "the gradients are unchanged";
      }
    }
    f.set_grads(4);
    opt.step(1e-2f);  // no scale given: 1
    return f.values();
  };
  for (bool adamw : {true, false})
    expect_bitwise_equal(run(false, adamw), run(true, adamw), adamw ? "adamw" : "sgd");
}

// Zeroing folded into the step (zero_gradients_in_next_step, as ZeRO-0 zeroes for the next
// step): the update is bitwise the one without it, every gradient read is left zero, and the
// request holds for one step only. The parameters (3 x 4097, 5, 1100 x 1000) give segment ends
// inside the zeroing's blocks of 4096 and, over 1M elements, pieces on 2 threads.
TEST(Optimizer, ZeroingInTheStepIsBitwiseTheSameUpdate) {
  ComputeThreads threads(2);
  auto run = [](bool zero, bool adamw) {
    Fixture f({3, 4097}, {{"v", {1100, 1000}}});  // v: past parallel_rows' 1M
    nn::ParameterSet& ps = f.ps;
    AdamW a(ps, AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f}, f.alloc);
    SGD s(ps, SGDConfig{0.9f, 0.1f}, f.alloc);
    Optimizer& opt = adamw ? static_cast<Optimizer&>(a) : s;
    for (int t = 1; t <= 3; ++t) {
      f.set_grads(t);
      if (zero) opt.zero_gradients_in_next_step();
      opt.step(1e-2f);
      for (int i = 0; i < ps.size(); ++i)
        for (float g : ps.grad(i).to_vector()) {
          if (zero)
            EXPECT_EQ(g, 0.0f) << ps.infos()[i].name;
          else
            EXPECT_NE(g, 0.0f) << ps.infos()[i].name;
        }
    }
    f.set_grads(4);
    opt.step(1e-2f);  // not requested: the gradients stay
    EXPECT_EQ(ps.grad(1).to_vector()[2], std::sin(0.3f * 2 + 4 + 1));
    return f.values();
  };
  for (bool adamw : {true, false})
    expect_bitwise_equal(run(false, adamw), run(true, adamw), adamw ? "adamw" : "sgd");
}

// A step writes the bf16 copy of every segment that has one from the values it has just updated
// (every element, at block and thread edges, with and without the zeroing), and the update itself
// is bitwise that of the same parameters without copies.
TEST(Optimizer, WritesTheBf16CopiesOfTheValuesItUpdates) {
  ComputeThreads threads(2);
  auto copies_hold_values = [](const nn::ParameterSet& ps) {
    for (int i = 0; i < ps.size(); ++i) {
      const uint16_t* copy = ps.bf16_copy(i);
      if (copy == nullptr) continue;
      const std::vector<float> v = ps.param(i).to_vector();
      std::vector<uint16_t> want(v.size());
      kernels::f32_to_bf16(want.data(), v.data(), static_cast<int64_t>(v.size()));
      for (size_t j = 0; j < v.size(); ++j)
        if (copy[j] != want[j]) return false;
    }
    return true;
  };
  for (bool adamw : {true, false}) {
    SCOPED_TRACE(adamw ? "adamw" : "sgd");
    std::vector<float> values[2];
    for (bool copies : {false, true}) {
      Fixture f({3, 4097}, {{"v", {1100, 1000}}}, copies);  // v: past parallel_rows' 1M
      nn::ParameterSet& ps = f.ps;
      EXPECT_EQ(ps.bf16_copy(1), nullptr);  // "b" has none
      EXPECT_EQ(ps.bf16_copy(0) != nullptr, copies);
      AdamW a(ps, AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f}, f.alloc);
      SGD s(ps, SGDConfig{0.9f, 0.1f}, f.alloc);
      Optimizer& opt = adamw ? static_cast<Optimizer&>(a) : s;
      for (int t = 1; t <= 3; ++t) {
        f.set_grads(t);
        if (t == 2) opt.zero_gradients_in_next_step();
        opt.step(1e-2f);
        if (copies) {
          EXPECT_TRUE(copies_hold_values(ps)) << "step " << t;
        }
      }
      values[copies] = f.values();
    }
    expect_bitwise_equal(values[0], values[1], "values");
  }
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s{1.0f, 10, 110, 0.1f};
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);
  EXPECT_FLOAT_EQ(s.at(9), 1.0f);
  EXPECT_FLOAT_EQ(s.at(10), 1.0f);
  EXPECT_NEAR(s.at(60), 0.55f, 1e-6);
  EXPECT_NEAR(s.at(110), 0.1f, 1e-6);
  EXPECT_NEAR(s.at(500), 0.1f, 1e-6);
}

}  // namespace
}  // namespace tessera::optim
