// The bf16 copies of the GEMM weights (nn/parameters.h) under data parallelism. A copy is converted
// once per step, not once per micro-batch, and an optimizer step over whole weights (ZeRO-0)
// writes it with the values it updates; every other writer (a sharded step and its gather,
// initialize, a load) leaves the copies to be converted again. Whatever the stage, training with
// copies is bitwise training that converts each weight at each GEMM (no copies): Llama, two
// micro-batches, ZeRO 0, 1 and 2 on one and two thread ranks, an evaluation forward between steps
// and a re-initialisation mid-run; and an optimizer stepping the model's parameters without an
// engine.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/kernels/bf16.h"
#include "tessera/nn/gpt.h"
#include "tessera/optim/adamw.h"
#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/gather.h"

namespace tessera::parallel {
namespace {

constexpr int kSeq = 8, kBatch = 4, kVocab = 64, kSteps = 4, kMicro = 2;

nn::GPTConfig llama() {
  nn::GPTConfig c;
  c.arch = nn::Arch::Llama;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.ffn_dim = 48;
  c.block_size = kSeq;
  c.vocab_size = kVocab;
  return c;
}

int32_t token(int64_t step, int64_t sample, int pos) {
  return static_cast<int32_t>((step * 5 + sample * 13 + pos * 7 + (sample * pos) % 5) % kVocab);
}

// The forward of samples [first, first + B) of `step`'s batch; the loss summed over its tokens.
double forward(nn::GPT& model, nn::StageRecord& rec, int64_t step, int64_t first, int B,
               bool training) {
  std::vector<int32_t> in, tgt;
  for (int64_t s = first; s < first + B; ++s)
    for (int p = 0; p < kSeq; ++p)
      in.push_back(token(step, s, p)), tgt.push_back(token(step, s, p + 1));
  const nn::StepContext ctx{5, static_cast<uint64_t>(step), training, 1.0f / (kBatch * kSeq)};
  return model.forward(ctx, nn::Batch{in.data(), tgt.data(), B, kSeq, first}, rec);
}

struct Trained {
  std::vector<double> losses, eval_losses, norms;
  std::map<std::string, std::vector<float>> weights;
  bool copies_written = true;  // after every ZeRO-0 step, each copy held bf16 of its values
};

// Whether every bf16 copy of `ps` holds the bf16 rounding of its parameter's values.
bool copies_hold_values(const nn::ParameterSet& ps) {
  for (int i = 0; i < ps.size(); ++i) {
    const uint16_t* copy = ps.bf16_copy(i);
    if (copy == nullptr) continue;
    const int64_t n = ps.infos()[i].local_numel();
    std::vector<uint16_t> want(static_cast<size_t>(n));
    kernels::f32_to_bf16(want.data(), ps.param_data(i), n);
    if (std::memcmp(want.data(), copy, sizeof(uint16_t) * static_cast<size_t>(n)) != 0)
      return false;
  }
  return true;
}

Trained train(int dp, int zero, bool copies) {
  Trained out;
  comm::run_inproc(dp, [&](comm::Communicator& world) {
    Allocator alloc("rank " + std::to_string(world.rank()));
    CurrentAllocatorScope scope(alloc);
    const DataParallelOptions o{zero_stage(zero), /*bucket_mb=*/0.01, /*overlap=*/true};
    nn::GPTLayout base;
    base.gemm = {kernels::Precision::BF16, kernels::Bf16Gemm::Emulated};
    base.bf16_weight_copies =
        copies ? nn::GPTLayout::WeightCopies::Always : nn::GPTLayout::WeightCopies::Never;
    const int per_rank = kBatch / dp, micro = per_rank / kMicro;
    nn::GPT model(llama(), micro, alloc, gpt_layout_for(o, dp, base));
    EXPECT_EQ(model.params().has_bf16_copies(), copies);
    DataParallel engine(model, world, o, alloc);
    engine.initialize(3);
    engine.create_optimizer([&](std::vector<optim::Segment> s, int64_t n) {
      return std::make_unique<optim::AdamW>(std::move(s), n, optim::AdamWConfig{}, alloc);
    });
    auto rec = model.make_record();
    auto pass = [&](int64_t step, int64_t first, bool training) {
      return forward(model, *rec, step, first, micro, training);
    };
    Trained r;
    for (int64_t step = 0; step < kSteps; ++step) {
      if (step == 2) engine.initialize(4);  // new values between two steps
      engine.begin_step();
      double sum = 0;
      for (int m = 0; m < kMicro; ++m) {
        sum += pass(step, world.rank() * per_rank + m * micro, true);
        model.backward(*rec, nullptr, nn::BackwardPass{m == kMicro - 1});
      }
      engine.end_backward();
      r.losses.push_back(all_reduce_sum(world, sum));
      r.norms.push_back(engine.grad_norm());
      engine.clip(r.norms.back(), 0.5);
      engine.optimizer_step(1e-2f);
      if (copies && zero == 0) r.copies_written &= copies_hold_values(model.params());
      // An evaluation forward after the step reads the updated weights.
      r.eval_losses.push_back(all_reduce_sum(world, pass(100, world.rank() * per_rank, false)));
    }
    for (auto& [name, t] : engine.full_weights()) r.weights[name] = t.to_vector();  // collective
    if (world.rank() == 0) out = std::move(r);
  });
  return out;
}

void expect_bitwise(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof(double)), 0)
        << what << " " << i << ": " << a[i] << " against " << b[i];
}

struct Layout {
  int dp, zero;
};

class Bf16WeightCopiesTraining : public ::testing::TestWithParam<Layout> {};

TEST_P(Bf16WeightCopiesTraining, IsBitwiseConvertingAtEveryGemm) {
  const Layout l = GetParam();
  const Trained with = train(l.dp, l.zero, true), without = train(l.dp, l.zero, false);
  expect_bitwise(with.losses, without.losses, "loss of step");
  expect_bitwise(with.eval_losses, without.eval_losses, "evaluation loss after step");
  expect_bitwise(with.norms, without.norms, "gradient norm of step");
  ASSERT_EQ(with.weights.size(), without.weights.size());
  for (const auto& [name, w] : without.weights) {
    const auto it = with.weights.find(name);
    ASSERT_NE(it, with.weights.end()) << name;
    ASSERT_EQ(it->second.size(), w.size()) << name;
    EXPECT_EQ(std::memcmp(it->second.data(), w.data(), sizeof(float) * w.size()), 0) << name;
  }
  // The runs really differ from step to step (a stale copy would change the numbers).
  EXPECT_NE(with.eval_losses[0], with.eval_losses[1]);
  EXPECT_TRUE(with.copies_written) << "a ZeRO-0 optimizer step left a copy behind its values";
}

// Without an engine: an optimizer stepping the model's parameter set directly writes the copies
// with the values (optim::Segment::bf16), so a model trained by hand is right too.
TEST(Bf16WeightCopies, AnOptimizerWithoutAnEngineKeepsThemCurrent) {
  auto run = [](bool copies) {
    Allocator alloc("one rank");
    CurrentAllocatorScope scope(alloc);
    nn::GPTLayout layout;
    layout.gemm = {kernels::Precision::BF16, kernels::Bf16Gemm::Emulated};
    layout.bf16_weight_copies =
        copies ? nn::GPTLayout::WeightCopies::Always : nn::GPTLayout::WeightCopies::Never;
    nn::GPT model(llama(), kBatch, alloc, layout);
    model.initialize(3);
    optim::AdamW opt(model.params(), optim::AdamWConfig{}, alloc);
    auto rec = model.make_record();
    std::vector<double> losses;
    for (int64_t step = 0; step < kSteps; ++step) {
      model.params().zero_grads();
      losses.push_back(forward(model, *rec, step, 0, kBatch, true));
      model.backward(*rec, nullptr, nn::BackwardPass{});
      opt.step(1e-2f);
    }
    return losses;
  };
  const std::vector<double> with = run(true), without = run(false);
  expect_bitwise(with, without, "loss of step");
  EXPECT_NE(with[1], with[2]);
}

INSTANTIATE_TEST_SUITE_P(Stages, Bf16WeightCopiesTraining,
                         ::testing::Values(Layout{1, 0}, Layout{2, 0}, Layout{2, 1}, Layout{2, 2}),
                         [](const auto& info) {
                           return "dp" + std::to_string(info.param.dp) + "_zero" +
                                  std::to_string(info.param.zero);
                         });

}  // namespace
}  // namespace tessera::parallel
