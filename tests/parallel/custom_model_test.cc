// The UnitModel extension point (nn/unit_model.h): a model written outside tessera, the example
// examples/custom_model (GPT-2 modules plus a user-written Adapter between the blocks), has the
// gradients of central differences, and trains under DataParallel at every ZeRO stage exactly as
// on one rank (dropout and clipping on): losses and gradient norms within 1e-5 relative at every
// step, weights within 1e-5. A model that breaks the contract gets a ConfigError saying what to
// change.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "adapter_gpt.h"
#include "tessera/comm/launch.h"
#include "tessera/optim/adamw.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/gather.h"
#include "weights_compare.h"

namespace tessera::parallel {
namespace {

constexpr int kSeq = 16, kBatch = 12, kSteps = 8;

nn::GPTConfig config() {
  nn::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = kSeq;
  c.vocab_size = 64;
  c.dropout = 0.1f;
  return c;
}

// Token t of global sample i at step s: a function of (s, i, t) only, so every layout sees the
// same global batch. Targets are the next token.
int32_t token(int64_t step, int64_t sample, int t) {
  uint64_t z = static_cast<uint64_t>((step * 1000 + sample) * 100 + t) * 0x9e3779b97f4a7c15ull;
  z ^= z >> 29;
  return static_cast<int32_t>((sample * 5 + t * 3 + (z % 4)) % 64);
}

struct Micro {
  std::vector<int32_t> tokens, targets;
  nn::Batch batch(int B, int64_t first) const {
    return nn::Batch{tokens.data(), targets.data(), B, kSeq, first};
  }
};

Micro micro_batch(int64_t step, int64_t first, int B) {
  Micro m;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < kSeq; ++t) {
      m.tokens.push_back(token(step, first + b, t));
      m.targets.push_back(token(step, first + b, t + 1));
    }
  return m;
}

struct Trained {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> weights;
};

Trained train_custom(int dp, int zero, int micro_batches) {
  Trained out;
  comm::run_inproc(dp, [&](comm::Communicator& world) {
    Allocator alloc("rank " + std::to_string(world.rank()));
    CurrentAllocatorScope scope(alloc);
    const DataParallelOptions o{zero_stage(zero), /*bucket_mb=*/0.02, /*overlap=*/true};
    const int per_rank = kBatch / dp, micro = per_rank / micro_batches;
    AdapterGPT model(config(), micro, alloc, flat_layout_for(o, dp), /*bottleneck=*/8);
    DataParallel engine(model, world, o, alloc);
    engine.initialize(11);
    engine.create_optimizer([&](std::vector<optim::Segment> s, int64_t n) {
      return std::make_unique<optim::AdamW>(std::move(s), n, optim::AdamWConfig{}, alloc);
    });
    const optim::LrSchedule lr{1e-2f, 2, kSteps, 0.1f};
    AdapterGPT::Record rec = model.make_record();
    Trained r;
    for (int64_t step = 0; step < kSteps; ++step) {
      const nn::StepContext ctx{5, static_cast<uint64_t>(step), true, 1.0f / (kBatch * kSeq)};
      engine.begin_step();
      double sum = 0;
      for (int m = 0; m < micro_batches; ++m) {
        const int64_t first = world.rank() * per_rank + m * micro;
        const Micro mb = micro_batch(step, first, micro);
        sum += model.forward(ctx, mb.batch(micro, first), rec);
        model.backward(rec, nn::BackwardPass{m == micro_batches - 1});
      }
      engine.end_backward();
      r.losses.push_back(all_reduce_sum(world, sum) / (kBatch * kSeq));
      r.norms.push_back(engine.grad_norm());
      engine.clip(r.norms.back(), 0.5);
      engine.optimizer_step(lr.at(step));
    }
    for (auto& [name, t] : engine.full_weights()) r.weights[name] = t.to_vector();  // collective
    if (world.rank() == 0) out = std::move(r);
  });
  return out;
}

const Trained& one_rank() {
  static const Trained r = train_custom(1, 0, 2);
  return r;
}

struct Layout {
  int dp, zero, micro_batches;
};

class CustomModelDataParallel : public ::testing::TestWithParam<Layout> {};

TEST_P(CustomModelDataParallel, TrainsAsOneRank) {
  const Layout l = GetParam();
  const Trained& ref = one_rank();
  const Trained got = train_custom(l.dp, l.zero, l.micro_batches);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(got.norms[i], ref.norms[i], 1e-5 * ref.norms[i]) << "norm, step " << i + 1;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front());  // it learns
  EXPECT_GT(ref.norms.front(), 0.5);                 // clipping is exercised
  ASSERT_TRUE(got.weights.contains("adapter.down.weight"));
  train::testing::expect_same_weights(ref.weights, got.weights, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CustomModelDataParallel,
                         ::testing::Values(Layout{2, 0, 2}, Layout{2, 1, 1}, Layout{3, 2, 2},
                                           Layout{2, 3, 2}, Layout{3, 3, 1}),
                         [](const auto& info) {
                           return "dp" + std::to_string(info.param.dp) + "_zero" +
                                  std::to_string(info.param.zero) + "_micro" +
                                  std::to_string(info.param.micro_batches);
                         });

// Central differences of the fp32 loss (dropout on: masks are keyed by coordinates, so each
// forward draws the same ones): every element of the small parameters (the adapter's biases, the
// LayerNorms), the largest and four other elements of the others.
TEST(CustomModel, GradientsMatchFiniteDifferences) {
  Allocator alloc("test");
  AdapterGPT model(config(), 3, alloc, nn::FlatLayout{}, 8);
  nn::ParameterSet& ps = model.params();
  ps.initialize(3);
  // Non-zero biases and a non-trivial adapter, so every gradient is exercised.
  for (int i = 0; i < ps.size(); ++i) {
    float* w = ps.param(i).f32();
    for (int64_t j = 0; j < ps.infos()[i].local_numel(); ++j)
      w[j] += 0.05f * std::sin(static_cast<float>(7 * i + j));
  }
  // Half of the adapter's bottleneck units off (the ReLU's zero side), the other half on, and
  // every pre-activation far from the kink that a step of h could cross.
  float* down_b = ps.param("adapter.down.bias").f32();
  for (int j = 0; j < 8; ++j) down_b[j] = j % 2 ? 0.3f : -0.3f;
  AdapterGPT::Record rec = model.make_record();
  const Micro mb = micro_batch(0, 0, 3);
  const float scale = 1.0f / (3 * kSeq);
  const nn::StepContext ctx{5, 0, true, scale};
  ps.zero_grads();
  model.forward(ctx, mb.batch(3, 0), rec);
  model.backward(rec, nn::BackwardPass{});
  int checked = 0;
  for (int i = 0; i < ps.size(); ++i) {
    const std::vector<float> g = ps.grad(i).to_vector();
    std::vector<size_t> at;
    if (g.size() <= 64) {
      for (size_t j = 0; j < g.size(); ++j) at.push_back(j);
    } else {
      at.push_back(0);
      for (size_t j = 0; j < g.size(); ++j)
        if (std::abs(g[j]) > std::abs(g[at[0]])) at[0] = j;
      for (size_t k = 1; k <= 4; ++k) at.push_back((k * 7919 + static_cast<size_t>(i)) % g.size());
    }
    float* w = ps.param(i).f32();
    for (size_t j : at) {
      const float saved = w[j], h = 1e-2f;
      w[j] = saved + h;
      const double lp = scale * model.forward(ctx, mb.batch(3, 0), rec);
      w[j] = saved - h;
      const double lm = scale * model.forward(ctx, mb.batch(3, 0), rec);
      w[j] = saved;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[j], fd, 2e-2 * std::abs(fd) + 2e-4) << ps.infos()[i].name << "[" << j << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(CustomModel, BrokenLayoutsAreConfigErrors) {
  comm::run_inproc(3, [](comm::Communicator& world) {
    Allocator alloc("rank");
    CurrentAllocatorScope scope(alloc);
    const DataParallelOptions zero1{ZeroStage::OptimizerState, 0.02, true};
    {  // padded for one rank, not for ZeRO over 3
      AdapterGPT model(config(), 2, alloc, nn::FlatLayout{}, 8);
      try {
        DataParallel engine(model, world, zero1, alloc);
        ADD_FAILURE() << "no error";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("pad_to_multiple"), std::string::npos) << e.what();
      }
    }
    {  // ZeRO-3 shards the parameters, but the model allocated the full buffer
      const DataParallelOptions zero3{ZeroStage::Parameters, 0.02, true};
      nn::FlatLayout f = flat_layout_for(zero3, 3);
      f.full_params = true;
      AdapterGPT model(config(), 2, alloc, f, 8);
      try {
        DataParallel engine(model, world, zero3, alloc);
        ADD_FAILURE() << "no error";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("flat_layout_for"), std::string::npos) << e.what();
      }
    }
  });
}

}  // namespace
}  // namespace tessera::parallel
