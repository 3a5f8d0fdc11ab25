// Under bf16 GEMMs a block keeps its GEMM-only inputs (ln_1, ln_2, gelu(fc)) in bf16
// (GPTLayout::bf16_gemm_inputs, decision 33). The GEMMs round them to those values anyway, so the
// losses, outputs and gradients are bitwise those of fp32 records: in every recompute mode, with
// the zero-bubble split, in a block's halves, and under tensor and sequence parallelism. The
// records shrink by exactly half of those tensors. Likewise the bf16 copies of the weights
// (GPTLayout::bf16_weight_copies: converted once per forward, not per GEMM) change no bit, dense
// or MoE, and cost exactly 2 bytes per GEMM weight.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "module_checks.h"
#include "tessera/comm/launch.h"
#include "tessera/nn/gpt.h"

namespace tessera::nn {
namespace {

using testing::as_batch;
using testing::ctx_of;
using testing::make_batch;
using testing::random_floats;
using testing::RefBatch;

GPTConfig small(float dropout) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 8;
  c.vocab_size = 29;
  c.dropout = dropout;
  return c;
}

// Everything a run leaves to compare: losses, the last stage output, every gradient.
struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> values;
};

void expect_bitwise(const Outcome& a, const Outcome& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    ASSERT_EQ(a.values[i].size(), b.values[i].size()) << i;
    ASSERT_EQ(
        0, std::memcmp(a.values[i].data(), b.values[i].data(), sizeof(float) * a.values[i].size()))
        << "tensor " << i;
  }
}

void noisy_init(GPT& m, uint64_t seed) {
  m.params().initialize(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (int i = 0; i < m.params().size(); ++i) {
    float* w = m.params().param_data(i);
    for (int64_t j = 0; j < m.params().infos()[i].local_numel(); ++j) w[j] += d(rng);
  }
}

GPTLayout bf16_layout(Recompute r, bool bf16_inputs, bool weight_copies = true) {
  GPTLayout l;
  l.recompute = r;
  l.gemm = {kernels::Precision::BF16, kernels::Bf16Gemm::Emulated};
  l.bf16_gemm_inputs = bf16_inputs;
  l.bf16_weight_copies =
      weight_copies ? GPTLayout::WeightCopies::Always : GPTLayout::WeightCopies::Never;
  return l;
}

// Two micro-batches in flight through `layout`'s units; a stage without the head gets a fixed
// output gradient, one without the embedding a fixed input.
Outcome run(const GPTConfig& cfg, const GPTLayout& layout, bool split_backward,
            comm::Communicator& tp) {
  Allocator alloc("test");
  GPT m(cfg, 2, alloc, layout, tp, tp);
  noisy_init(m, 7);
  Outcome out;
  std::vector<RefBatch> mb;
  std::vector<std::unique_ptr<StageRecord>> rec;
  const size_t hidden = static_cast<size_t>(m.hidden_elems(2, cfg.block_size));
  for (int i = 0; i < 2; ++i) {
    mb.push_back(make_batch(cfg, 2, cfg.block_size, 50 + i, cfg.dropout, 2 * i));
    rec.push_back(m.make_record());
    if (!m.has_embedding()) {
      const auto x = random_floats(hidden, 60 + i);
      std::memcpy(m.input(*rec[i]), x.data(), sizeof(float) * hidden);
    }
    out.losses.push_back(m.forward(ctx_of(mb[i], 0.03f), as_batch(mb[i]), *rec[i]));
    if (!m.has_head()) out.values.emplace_back(m.output(*rec[i]), m.output(*rec[i]) + hidden);
  }
  const auto dout = random_floats(hidden, 70);
  for (int i = 1; i >= 0; --i) {
    const float* d = m.has_head() ? nullptr : dout.data();
    if (split_backward) {
      m.backward_input(*rec[i], d);
      if (!m.has_embedding())
        out.values.emplace_back(m.input_grad(*rec[i]), m.input_grad(*rec[i]) + hidden);
      m.backward_weight(*rec[i]);
    } else {
      m.backward(*rec[i], d);
      if (!m.has_embedding())
        out.values.emplace_back(m.input_grad(*rec[i]), m.input_grad(*rec[i]) + hidden);
    }
  }
  for (ParamGroup g : {ParamGroup::Model, ParamGroup::Experts}) {
    const ParameterSet& ps = m.params(g);
    for (int i = 0; i < ps.size(); ++i) out.values.push_back(ps.grad(i).to_vector());
  }
  return out;
}

// The same on one rank.
Outcome run(const GPTConfig& cfg, const GPTLayout& layout, bool split_backward) {
  const auto one = comm::one_rank();
  return run(cfg, layout, split_backward, *one);
}

struct Variant {
  const char* name;
  Recompute recompute;
  bool split_backward;
  int first_unit = 0, last_unit = -1;  // units of the stage (L = 2: blocks 1 and 2, head 3)
  bool starts_mid = false, ends_mid = false;
};

class Bf16Records : public ::testing::TestWithParam<Variant> {};

TEST_P(Bf16Records, GiveTheNumbersOfFp32Records) {
  const Variant& v = GetParam();
  const GPTConfig cfg = small(0.1f);
  auto layout = [&](bool bf16_inputs, bool weight_copies = true) {
    GPTLayout l = bf16_layout(v.recompute, bf16_inputs, weight_copies);
    l.first_unit = v.first_unit, l.last_unit = v.last_unit;
    l.starts_mid_block = v.starts_mid, l.ends_mid_block = v.ends_mid;
    return l;
  };
  // Every GEMM input fp32 and every weight converted at each GEMM, against the bf16 records, the
  // weight copies, and both.
  const Outcome per_gemm = run(cfg, layout(false, false), v.split_backward);
  for (auto [inputs, copies] : {std::pair{true, false}, {false, true}, {true, true}}) {
    SCOPED_TRACE(std::string("bf16 records ") + (inputs ? "on" : "off") + ", weight copies " +
                 (copies ? "on" : "off"));
    expect_bitwise(per_gemm, run(cfg, layout(inputs, copies), v.split_backward));
  }
  // The records really are bf16 (recomputation keeps none of those tensors).
  Allocator a("a"), b("b");
  GPT with(cfg, 2, a, layout(true)), without(cfg, 2, b, layout(false));
  auto r1 = with.make_record();
  auto r2 = without.make_record();
  if (v.recompute == Recompute::Full)
    EXPECT_EQ(a.in_use(MemCategory::Activations), b.in_use(MemCategory::Activations));
  else
    EXPECT_LT(a.in_use(MemCategory::Activations), b.in_use(MemCategory::Activations));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, Bf16Records,
    ::testing::Values(Variant{"none", Recompute::None, false},
                      Variant{"selective", Recompute::Selective, false},
                      Variant{"full", Recompute::Full, false},
                      Variant{"none_zero_bubble", Recompute::None, true},
                      Variant{"selective_zero_bubble", Recompute::Selective, true},
                      Variant{"full_zero_bubble", Recompute::Full, true},
                      Variant{"attention_half_last", Recompute::None, true, 0, 2, false, true},
                      Variant{"mlp_half_first", Recompute::Selective, false, 2, -1, true, false}),
    [](const auto& info) { return std::string(info.param.name); });

// Bytes per block: ln_1 (C), ln_2 (C) and gelu(fc) (4C) per token in 2 bytes instead of 4: 12 b s C
// fewer bytes, nothing else changes (atty stays fp32: the fused attention's backward reads it).
TEST(Bf16Records, SaveTwoBytesPerElementOfTheGemmInputs) {
  for (Recompute r : {Recompute::None, Recompute::Selective}) {
    auto record_bytes = [&](int layers, bool bf16_inputs) {
      GPTConfig cfg = small(0.1f);
      cfg.n_layer = layers;
      Allocator alloc("test");
      GPT model(cfg, 3, alloc, bf16_layout(r, bf16_inputs));
      const size_t before = alloc.in_use(MemCategory::Activations);
      auto rec = model.make_record();
      return static_cast<double>(alloc.in_use(MemCategory::Activations) - before);
    };
    const double fp32 = record_bytes(3, false) - record_bytes(2, false);
    const double bf16 = record_bytes(3, true) - record_bytes(2, true);
    const double b = 3, s = 8, h = 16;
    EXPECT_EQ(fp32 - bf16, 12 * b * s * h) << to_string(r);
  }
}

// Tensor parallelism with sequence parallelism (the record keeps its rows of ln_1 and ln_2; the
// backward widens and all-gathers them again), with and without the zero-bubble split.
TEST(Bf16Records, GiveTheNumbersOfFp32RecordsUnderSequenceParallelism) {
  const GPTConfig cfg = small(0.1f);
  for (bool split : {false, true}) {
    std::vector<Outcome> fp32(2), bf16(2);
    comm::run_inproc(2, [&](comm::Communicator& c) {
      for (bool bf16_inputs : {false, true}) {
        GPTLayout l = bf16_layout(Recompute::None, bf16_inputs);
        l.sequence_parallel = true;
        (bf16_inputs ? bf16 : fp32)[static_cast<size_t>(c.rank())] = run(cfg, l, split, c);
      }
    });
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE("tp rank " + std::to_string(r) + (split ? ", zero-bubble" : ""));
      expect_bitwise(fp32[static_cast<size_t>(r)], bf16[static_cast<size_t>(r)]);
    }
  }
}

// The weight copies: with the mixture of experts (each expert's weights read by several row
// blocks), bitwise the per-GEMM conversions; 2 bytes per GEMM weight (4 C^2 per attention, 8 C^2
// per dense MLP and per expert, V C for the head), each copy 64-byte aligned; none in fp32, on the
// emulated path unless asked for (Auto), or without resident parameters (ZeRO-3).
TEST(Bf16WeightCopies, GiveTheNumbersOfPerGemmConversionsWithExperts) {
  GPTConfig cfg = small(0.1f);
  cfg.moe.experts = 4;
  cfg.moe.every = 2;  // block 1 is MoE, block 0 dense
  expect_bitwise(run(cfg, bf16_layout(Recompute::None, true, false), false),
                 run(cfg, bf16_layout(Recompute::None, true, true), false));
}

TEST(Bf16WeightCopies, CostTwoBytesPerGemmWeight) {
  GPTConfig cfg = small(0.0f);
  cfg.moe.experts = 4;
  cfg.moe.every = 2;
  auto param_bytes = [&](GPTLayout l) {
    Allocator alloc("test");
    GPT m(cfg, 1, alloc, l);
    return static_cast<int64_t>(alloc.in_use(MemCategory::Parameters));
  };
  auto round64 = [](int64_t elems) { return (elems + 31) / 32 * 32 * 2; };  // bytes
  const int64_t C = cfg.n_embd;
  const int64_t expected = 2 * (round64(3 * C * C) + round64(C * C)) +  // two attentions
                           2 * round64(4 * C * C) +                     // the dense MLP
                           4 * 2 * round64(4 * C * C) +           // four experts, two weights each
                           round64(int64_t{cfg.vocab_size} * C);  // the tied head
  const GPTLayout with = bf16_layout(Recompute::None, true, true);
  EXPECT_EQ(param_bytes(with) - param_bytes(bf16_layout(Recompute::None, true, false)), expected);
  GPTLayout fp32;
  GPTLayout fp32_copies = fp32;
  fp32_copies.bf16_weight_copies = GPTLayout::WeightCopies::Always;
  EXPECT_EQ(param_bytes(fp32_copies), param_bytes(fp32));  // fp32: no copies whatever the flag
  GPTLayout emulated_auto = with;  // Auto: copies only where oneDNN reads them in place
  emulated_auto.bf16_weight_copies = GPTLayout::WeightCopies::Auto;
  EXPECT_EQ(param_bytes(emulated_auto), param_bytes(bf16_layout(Recompute::None, true, false)));
  GPTLayout sharded = with;
  sharded.full_params = false;  // ZeRO-3: the gathered buffers are read as they are
  Allocator alloc("zero3");
  GPT m(cfg, 1, alloc, sharded);
  EXPECT_FALSE(m.params().has_bf16_copies());
  EXPECT_FALSE(m.params(ParamGroup::Experts).has_bf16_copies());
}

}  // namespace
}  // namespace tessera::nn
