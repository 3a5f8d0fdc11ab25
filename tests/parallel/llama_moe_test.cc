// The Llama family's mixtures of experts train the same model under every layout as on one rank
// holding every expert: expert parallelism with data parallelism and ZeRO 0-3, tensor parallelism
// (the routed experts whole on every tp rank, the shared expert split like a dense MLP) with and
// without sequence parallelism, every pipeline schedule, recomputation. Three models: Qwen2-MoE's
// kind (a gated shared expert, plain top-k gates, capacity dropping), DeepSeek's kind (sigmoid
// scores, an ungated shared expert, auxiliary-loss-free balancing) and Mixtral's (every other
// block MoE here). A representative subset runs in the suite; TESSERA_LLAMA_MOE_GRID=1
// (scripts/llama_moe_grid.sh) runs the full grid. Then the selection bias of auxiliary-loss-free
// balancing: it evens a skewed router's loads, is the same on every rank and in every layout, and
// resumes bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_compare.h"
#include "tessera/io/safetensors.h"
#include "tessera/kernels/precision.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

using testing::expect_same_run;
using testing::Reference;
using testing::run_reference;
using testing::temp_dir;

enum class Kind { Qwen, DeepSeek, Mixtral };

const char* name_of(Kind k) {
  return k == Kind::Qwen ? "qwen" : k == Kind::DeepSeek ? "deepseek" : "mixtral";
}

// 2 blocks of 4 query heads over 2 key/value heads, 4 experts of width 16 (a dense MLP would be
// 48), top-2, attention dropout, clipping, one sequence per micro-batch in every layout (as
// moe_training_test.cc), auxiliary losses on.
TrainConfig moe_config(const std::filesystem::path& dir, Kind kind) {
  TrainConfig c = testing::tiny_config(dir);
  c.arch = nn::Arch::Llama;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_dim = 48;
  c.tie_embeddings = kind == Kind::DeepSeek;
  c.batch = 4;
  c.micro_batch = 1;
  c.steps = 6;
  c.lr = 5e-3f;
  c.dropout = 0.1f;
  c.grad_clip = 0.5f;
  c.bucket_mb = 0.01;
  c.val_fraction = 0;
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_ffn_dim = 16;
  c.moe_aux_loss = 0.05f;
  c.moe_z_loss = 0.01f;
  switch (kind) {
    case Kind::Qwen:
      c.qkv_bias = true;
      c.moe_shared_ffn_dim = 32;
      c.moe_shared_gate = true;
      c.moe_renormalize = false;
      c.moe_capacity_factor = 0.75f;  // ceil(0.75 x 2 x 16 / 4) = 6 of a sequence's 32
      break;
    case Kind::DeepSeek:
      c.moe_router = nn::RouterScore::Sigmoid;
      c.moe_shared_ffn_dim = 32;
      c.moe_bias_rate = 1e-3f;
      break;
    case Kind::Mixtral:
      c.moe_every = 2;
      break;
  }
  return c;
}

const Reference& one_rank(Kind kind) {
  static std::map<Kind, Reference> refs;
  auto it = refs.find(kind);
  if (it == refs.end()) {
    auto dir = temp_dir(std::string("llama_moe_reference_") + name_of(kind));
    it = refs.emplace(kind, run_reference("run", moe_config(dir, kind), dir)).first;
  }
  return it->second;
}

struct Layout {
  Kind kind = Kind::Qwen;
  int dp = 1, ep = 1, zero = 0, tp = 1, pp = 1;
  bool sp = false;
  std::string schedule = "1f1b";
  std::string recompute = "none";
};

std::string layout_name(const Layout& l) {
  std::string s = std::string(name_of(l.kind)) + "_dp" + std::to_string(l.dp) + "_ep" +
                  std::to_string(l.ep) + "_zero" + std::to_string(l.zero);
  if (l.tp > 1) s += "_tp" + std::to_string(l.tp) + (l.sp ? "sp" : "");
  if (l.pp > 1) s += "_pp" + std::to_string(l.pp) + "_" + l.schedule;
  if (l.recompute != "none") s += "_" + l.recompute;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

class LlamaMoeLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(LlamaMoeLayouts, SameLossesAndWeightsAsOneRank) {
  const Layout l = GetParam();
  const Reference& ref = one_rank(l.kind);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.2) << "the reference run should learn";
  auto dir = temp_dir("llama_moe_" + layout_name(l));
  TrainConfig c = moe_config(dir, l.kind);
  c.dp = l.dp;
  c.ep = l.ep;
  c.zero = l.zero;
  c.tp = l.tp;
  c.sp = l.sp;
  c.pp = l.pp;
  c.recompute = nn::parse_recompute(l.recompute);
  if (l.pp > 1) {
    c.schedule = parallel::parse_schedule(l.schedule);
    c.virtual_stages = l.schedule == "interleaved" ? 2 : 1;
  }
  const Reference got = run_reference("run", c, dir);
  // Losses and gradient norms within 1e-5 at every step. Weights: 5e-5 where a GEMM is split
  // (tp, dp: llama_layouts_test.cc's bound, run_compare.h says why) and for the experts, whose
  // rows of several sequences meet in one GEMM (moe_training_test.cc says why); 1e-5 otherwise.
  // The selection biases are sums of +-u: equal unless a step's routing differed.
  const bool split = l.tp > 1 || l.dp > 1;
  expect_same_run(ref, got, split ? testing::kTensorParallelWeightRel : 1e-5, 5e-5);
}

// A representative subset; TESSERA_LLAMA_MOE_GRID=1 (scripts/llama_moe_grid.sh) runs each kind
// under ep {1,2,4} x dp (the multiples of ep up to 4) x ZeRO {0,1,2,3}, tp 2 (with and without
// sp, each recomputation) at ep {1,2}, and pp 2 under every schedule (each recomputation under
// 1f1b) at ep {1,2}.
std::vector<Layout> layouts() {
  const char* grid = std::getenv("TESSERA_LLAMA_MOE_GRID");
  if (grid == nullptr || std::string(grid) != "1") {
    std::vector<Layout> v(8);
    v[0].dp = 2, v[0].ep = 2, v[0].zero = 1;
    v[1].dp = 2, v[1].ep = 2, v[1].zero = 3, v[1].tp = 2, v[1].sp = true, v[1].recompute = "full";
    v[2].dp = 2, v[2].ep = 2, v[2].pp = 2;
    v[3].kind = Kind::DeepSeek, v[3].tp = 2;
    v[4].kind = Kind::DeepSeek, v[4].dp = 2, v[4].ep = 2, v[4].zero = 2, v[4].pp = 2,
    v[4].schedule = "zb-h1", v[4].recompute = "selective";
    v[5].kind = Kind::DeepSeek, v[5].dp = 4, v[5].ep = 4, v[5].zero = 3;
    v[6].kind = Kind::Mixtral, v[6].dp = 2, v[6].ep = 2, v[6].pp = 2, v[6].schedule = "gpipe";
    v[7].kind = Kind::Mixtral, v[7].tp = 2, v[7].pp = 2, v[7].schedule = "interleaved";
    return v;
  }
  std::vector<Layout> v;
  for (Kind k : {Kind::Qwen, Kind::DeepSeek, Kind::Mixtral}) {
    for (int ep : {1, 2, 4})
      for (int dp = ep; dp <= 4; dp *= 2)
        for (int zero : {0, 1, 2, 3}) {
          if (dp == 1 && zero > 0) continue;
          Layout l;
          l.kind = k, l.dp = dp, l.ep = ep, l.zero = zero;
          v.push_back(l);
        }
    for (int ep : {1, 2})
      for (bool sp : {false, true})
        for (const char* rc : {"none", "selective", "full"}) {
          Layout l;
          l.kind = k, l.dp = 2, l.ep = ep, l.zero = ep == 1 ? 1 : 3, l.tp = 2, l.sp = sp;
          l.recompute = rc;
          v.push_back(l);
        }
    for (int ep : {1, 2}) {
      for (const char* s : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
        Layout l;
        l.kind = k, l.dp = 2, l.ep = ep, l.zero = 2, l.pp = 2, l.schedule = s;
        v.push_back(l);
      }
      for (const char* rc : {"selective", "full"}) {
        Layout l;
        l.kind = k, l.dp = 2, l.ep = ep, l.zero = 3, l.pp = 2, l.tp = 2, l.recompute = rc;
        v.push_back(l);
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layouts, LlamaMoeLayouts, ::testing::ValuesIn(layouts()),
                         [](const auto& info) { return layout_name(info.param); });

// Under --precision bf16 (the emulated path, any CPU) a layout trains what one bf16 rank trains
// within 1e-3 relative loss per step (llama_layouts_test.cc's bound): the experts' and the shared
// expert's GEMMs in bf16, the router in fp32.
TEST(LlamaMoeBf16, LayoutsTrainLikeOneBf16Rank) {
  auto bf16 = [](TrainConfig c) {
    c.precision = kernels::Precision::BF16;
    c.bf16_gemm = kernels::Bf16Gemm::Emulated;
    c.dropout = 0;
    return c;
  };
  auto dir = temp_dir("llama_moe_bf16");
  TrainConfig f = moe_config(dir, Kind::Qwen);
  f.dropout = 0;
  const std::vector<double> fp32 = run_training(f, nullptr).losses;
  const std::vector<double> one = run_training(bf16(moe_config(dir, Kind::Qwen)), nullptr).losses;
  double from_fp32 = 0;
  for (size_t i = 0; i < one.size(); ++i)
    from_fp32 = std::max(from_fp32, std::abs(one[i] - fp32[i]) / fp32[i]);
  EXPECT_GT(from_fp32, 1e-6) << "bf16 gave fp32's losses: the precision was not applied";
  TrainConfig c = bf16(moe_config(dir, Kind::Qwen));
  c.tp = 2, c.sp = true, c.dp = 2, c.ep = 2, c.zero = 3, c.pp = 2;
  const std::vector<double> got = run_training(c, nullptr).losses;
  ASSERT_EQ(got.size(), one.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], one[i], 1e-3 * one[i]) << "step " << i + 1;
    worst = std::max(worst, std::abs(got[i] - one[i]) / one[i]);
  }
  std::printf(
      "[ bf16 llama moe ] bf16 against fp32 %.2e, tp2 sp x dp2 ep2 x pp2 against one bf16 "
      "rank %.2e\n",
      from_fp32, worst);
}

// The metrics' per-expert loads (the step's share of the router's choices) of layer h.0.
std::vector<std::vector<double>> loads_of(const std::filesystem::path& metrics) {
  std::vector<std::vector<double>> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("moe_load")) out.push_back(j["moe_load"]["h.0"].get<std::vector<double>>());
  }
  return out;
}

double max_share(const std::vector<double>& load) {
  return *std::max_element(load.begin(), load.end());
}

// Weights whose routers score the tokens apart (the initial router weights x 10: logits of
// standard deviation about 1, as a trained router's, rather than 0.1) and whose selection biases
// favour expert 0 by 0.3: a router skewed onto one expert.
std::filesystem::path skewed_weights(const std::filesystem::path& dir) {
  TrainConfig c = moe_config(dir, Kind::DeepSeek);
  c.steps = 0;
  c.save = (dir / "init").string();
  run_training(c, nullptr);
  io::NamedTensors tensors;
  {
    io::SafetensorsFile f(dir / "init" / "model.safetensors");
    for (const std::string& n : f.names()) {
      Tensor t = Tensor::empty(f.shape(n), DType::F32, MemCategory::Buffers, n);
      f.read_f32(n, t.f32(), t.numel());
      if (n.ends_with("e_score_correction_bias")) t.f32()[0] = 0.3f;
      if (n.ends_with("mlp.gate.weight"))
        for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] *= 10;
      tensors.emplace_back(n, std::move(t));
    }
  }
  io::save_safetensors(dir / "init" / "model.safetensors", tensors);
  return dir / "init";
}

// The busiest expert's share of a layer's choices, averaged over steps [first, last).
double busiest(const std::vector<std::vector<double>>& loads, size_t first, size_t last) {
  double s = 0;
  for (size_t i = first; i < last; ++i) s += max_share(loads[i]);
  return s / static_cast<double>(last - first);
}

// With the router skewed onto expert 0 and the auxiliary losses off, the bias moves the loads
// toward balance step by step; with the rate 0 the skewed bias stays (it is the model's state) and
// so does the skew.
TEST(MoeSelectionBias, EvensTheLoadsOfASkewedRouter) {
  auto dir = temp_dir("llama_moe_bias_balance");
  const std::filesystem::path init = skewed_weights(dir);
  auto run = [&](float rate, const std::string& name) {
    TrainConfig c = moe_config(dir, Kind::DeepSeek);
    c.init_from = init.string();
    c.moe_aux_loss = 0;
    c.moe_z_loss = 0;
    c.moe_bias_rate = rate;
    c.steps = 16;
    c.dp = 2;
    c.ep = 2;
    c.metrics = (dir / (name + ".jsonl")).string();
    c.save = (dir / name).string();
    run_training(c, nullptr);
    return loads_of(c.metrics);
  };
  const std::vector<std::vector<double>> frozen = run(0.0f, "frozen"),
                                         moving = run(0.02f, "moving");
  ASSERT_EQ(moving.size(), 16u);
  ASSERT_EQ(frozen.size(), 16u);
  EXPECT_EQ(frozen.front(), moving.front()) << "the first step routes with the loaded bias";
  const double start = max_share(moving.front()), end = busiest(moving, 12, 16);
  EXPECT_GT(start, 0.4) << "the router should start skewed onto expert 0 (0.25 is balanced)";
  EXPECT_LT(end, start - 0.06) << "the bias should even the loads";  // measured: 0.41 -> 0.30
  EXPECT_LT(end, busiest(frozen, 12, 16) - 0.1);                     // frozen: 0.48
  // The bias of the overloaded expert went down while it was overloaded; the frozen one stayed.
  float b[4];
  io::SafetensorsFile(dir / "moving" / "model.safetensors")
      .read_f32("model.layers.0.mlp.gate.e_score_correction_bias", b, 4);
  EXPECT_LT(b[0], 0.3f - 0.02f * 4);
  io::SafetensorsFile(dir / "frozen" / "model.safetensors")
      .read_f32("model.layers.0.mlp.gate.e_score_correction_bias", b, 4);
  EXPECT_EQ(b[0], 0.3f);
}

std::map<std::string, std::vector<float>> biases_of(const std::filesystem::path& file) {
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, v] : testing::read_weights(file))
    if (name.ends_with("e_score_correction_bias")) out[name] = std::move(v);
  return out;
}

// Every rank computes the biases from the same counts (the trainer checks that they are bitwise
// the same on every rank at each save); a layout that routes the same tokens the same way ends
// with the same biases as one rank; a run resumed from a checkpoint continues them bitwise.
TEST(MoeSelectionBias, IsTheSameOnEveryRankAndInEveryLayoutAndResumesBitwise) {
  auto dir = temp_dir("llama_moe_bias_layouts");
  const Reference& ref = one_rank(Kind::DeepSeek);
  std::map<std::string, std::vector<float>> ref_bias;
  for (const auto& [name, v] : ref.weights)
    if (name.ends_with("e_score_correction_bias")) ref_bias[name] = v;
  ASSERT_EQ(ref_bias.size(), 2u);
  bool moved = false;
  for (const auto& [name, v] : ref_bias)
    for (float x : v) moved = moved || x != 0.0f;
  EXPECT_TRUE(moved) << "the biases should have moved";

  // Every rank of a 3D layout (tp 2 x pp 2 x dp 2, ep 2) saves: check_identical passed, and the
  // biases are one rank's.
  TrainConfig c = moe_config(dir, Kind::DeepSeek);
  c.tp = 2, c.pp = 2, c.dp = 2, c.ep = 2, c.zero = 1;
  c.save = (dir / "3d").string();
  run_training(c, nullptr);
  EXPECT_EQ(biases_of(dir / "3d" / "model.safetensors"), ref_bias);

  // Saved at step 3 under dp 2 x ep 2, resumed there: the same biases and losses as without the
  // interruption, and resumed under one rank the same as well.
  TrainConfig whole = moe_config(dir, Kind::DeepSeek);
  whole.dp = 2, whole.ep = 2;
  whole.save = (dir / "whole").string();
  whole.save_every = 3;
  const TrainResult w = run_training(whole, nullptr);
  for (const int dp : {2, 1}) {
    TrainConfig rest = moe_config(dir, Kind::DeepSeek);
    rest.dp = dp, rest.ep = dp;
    rest.resume = (dir / "whole" / "step-00000003").string();
    rest.save = (dir / ("rest_dp" + std::to_string(dp))).string();
    const TrainResult r = run_training(rest, nullptr);
    testing::expect_resumed(w, r, 3);
    EXPECT_EQ(biases_of(dir / ("rest_dp" + std::to_string(dp)) / "model.safetensors"),
              biases_of(dir / "whole" / "model.safetensors"))
        << "resumed under dp " << dp;
  }
  EXPECT_EQ(biases_of(dir / "whole" / "model.safetensors"), ref_bias);
}

TEST(LlamaMoeConfig, SettingsOfTheLlamaFamilyAreRefusedElsewhere) {
  auto dir = temp_dir("llama_moe_bad");
  TrainConfig c = moe_config(dir, Kind::Qwen);
  c.arch = nn::Arch::Gpt2;
  c.kv_heads = 0, c.ffn_dim = 0, c.qkv_bias = false, c.tie_embeddings = true;
  std::string e = testing::config_error_of(c);
  EXPECT_NE(e.find("--moe-ffn-dim"), std::string::npos) << e;
  c = moe_config(dir, Kind::Qwen);
  c.moe_shared_ffn_dim = 0;
  e = testing::config_error_of(c);
  EXPECT_NE(e.find("--moe-shared-gate gates the shared expert"), std::string::npos) << e;
  c = moe_config(dir, Kind::Qwen);
  c.tp = 4;
  c.heads = 4, c.kv_heads = 4, c.moe_shared_ffn_dim = 30;
  e = testing::config_error_of(c);
  EXPECT_NE(e.find("shared expert's width 30"), std::string::npos) << e;
}

}  // namespace
}  // namespace tessera::train
