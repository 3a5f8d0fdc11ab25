// The planner against the allocator: for layouts mixing dp, tp (with and without sp), pp, ZeRO,
// ep (mixture of experts), every schedule and
// recomputation, in fp32 and in bf16 (whose ZeRO-3 gathers and activations travel in bf16), a
// short real run's per-rank peak (every category, as the allocator counts it) is within 10% of
// the tessera engine's prediction for that rank, and the data-parallel bytes rank 0 sent per step
// are the planner's. Mixture-of-experts layouts: one rank runs every assignment whatever the
// routing, so its plan is exact; with ep > 1 the rows a rank's experts receive follow the routing,
// which the planner takes as balanced, while at initialisation (these runs) a rank drew up to
// 11% more memory than balanced (tp = 2 with full recomputation, whose one recomputed record and
// exchange scratch are grown to the busiest layer's rows): 15% there. Context parallelism (cp 2,
// each --cp-comm, GPT-2 and Llama with grouped-query heads, alone and with dp/ZeRO, tp/sp, pp,
// recomputation and a mixture of experts): the peaks as above, the bytes rank 0 sent its cp ranks
// are the planner's to the byte. (Step times are noisy on a shared machine; their validation is a
// benchmark: bench/plan/validate.sh.)
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/plan/planner.h"
#include "tessera/train/plan_of.h"
#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::plan {
namespace {

using train::TrainConfig;

struct Case {
  std::string name;
  int dp = 1, tp = 1, pp = 1, zero = 0, micro_batch = 0, v = 1;
  std::string schedule = "1f1b", recompute = "none";
  int layers = 4;  // 3: the balanced pp=2 split cuts block 2 after its attention
  std::string precision = "fp32";
  bool sp = false;
  int ep = 1, experts = 0;  // experts > 0: every block a mixture of experts, top-2
  float capacity = 0;
  std::string weight_copies = "auto";  // --bf16-weight-copies (auto: off on the emulated path)
  bool llama = false;  // the Llama family: 4 heads over 2 key/value heads, SwiGLU 96, untied head
  int cp = 1;
  std::string cp_comm = "allgather";
  // Above the run's peak by up to this much (0: the usual bound, both ways; see cp_cases).
  double over = 0;
  std::string zero_shard_group = "all";  // HSDP: a number of ranks
  DType grad_reduce = DType::F32;        // --grad-reduce-dtype
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// Enough units and buckets that ZeRO shards and pipeline stages differ from the whole model.
TrainConfig base_config(const std::filesystem::path& dir) {
  TrainConfig c = train::testing::tiny_config(dir);
  c.layers = 4;
  c.dim = 64;
  c.heads = 4;
  c.seq = 32;
  c.batch = 8;
  c.steps = 2;
  c.warmup = 1;
  c.val_fraction = 0;
  c.eval_every = 0;
  c.sample_tokens = 0;
  c.bucket_mb = 0.05;
  return c;
}

// A cluster with room for every rank (memory is what is compared here, not time).
ClusterSpec roomy(int devices) {
  ClusterSpec c;
  c.name = "test";
  c.devices_per_node = devices;
  c.device_memory_gib = 64;
  c.peak_tflops["fp32"] = 0.1;
  c.memory_bandwidth_gbs = 10;
  c.intra_node = c.inter_node = LinkSpec{5, 2};
  c.engine = "tessera";
  c.precision = "fp32";
  return c;
}

// The vocabulary the run's tokenizer ended with ("vocab=N" in its header line).
int vocab_of(const std::string& log) {
  std::smatch m;
  const std::regex re("vocab=([0-9]+)");
  EXPECT_TRUE(std::regex_search(log, m, re)) << log;
  return std::stoi(m[1]);
}

class MemoryValidation : public ::testing::TestWithParam<Case> {};

TEST_P(MemoryValidation, AllocatorPeakWithinTenPercentOfThePlan) {
  const Case& k = GetParam();
  static const std::filesystem::path dir = train::testing::temp_dir("plan_memory");
  TrainConfig c = base_config(dir);
  c.dp = k.dp;
  c.tp = k.tp;
  c.pp = k.pp;
  c.zero = k.zero;
  c.micro_batch = k.micro_batch;
  c.schedule = parallel::parse_schedule(k.schedule);
  c.virtual_stages = k.v;
  c.recompute = nn::parse_recompute(k.recompute);
  c.layers = k.layers;
  c.precision = kernels::parse_precision(k.precision);
  c.sp = k.sp;
  c.ep = k.ep;
  c.moe_experts = k.experts;
  c.moe_capacity_factor = k.capacity;
  c.bf16_gemm = kernels::Bf16Gemm::Emulated;  // any CPU
  c.bf16_weight_copies = nn::parse_weight_copies(k.weight_copies);
  c.cp = k.cp;
  c.cp_comm = nn::parse_cp_comm(k.cp_comm);
  c.zero_shard_group = k.zero_shard_group;
  c.grad_reduce_dtype = k.grad_reduce;
  if (k.llama) {
    c.arch = nn::Arch::Llama;
    c.kv_heads = 2;
    c.ffn_dim = 96;
    c.tie_embeddings = false;
  }
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* log = open_memstream(&buf, &len);
  const train::TrainResult res = train::run_training(c, log);
  std::fclose(log);
  const std::string text(buf, len);
  std::free(buf);
  if (k.layers == 3) {
    ASSERT_NE(text.find("[0-2(attn)] [2(mlp)-4]"), std::string::npos) << text;
  }

  PlanRequest r;
  r.model = model_of(c);
  r.model.vocab = vocab_of(text);
  r.global_batch = c.batch;
  r.engine_options = engine_options_of(c);
  r.cluster = roomy(c.world());
  const Prediction p = plan_layout(r, layout_of(c));
  ASSERT_TRUE(p.ok()) << p.problems.front();
  ASSERT_EQ(res.memory_peaks.size(), static_cast<size_t>(c.world()));
  for (int w = 0; w < c.world(); ++w) {
    const int pp_rank = w / (c.dp * c.cp * c.tp);
    const double predicted = p.rank_memory[static_cast<size_t>(pp_rank)].total();
    const double measured = static_cast<double>(res.memory_peaks[static_cast<size_t>(w)]);
    std::printf("%-28s rank %d (stage %d): measured %9.0f B, planned %9.0f B (%+.2f%%)\n",
                k.name.c_str(), w, pp_rank, measured, predicted, 100 * (predicted / measured - 1));
    const MemoryTerms& t = p.rank_memory[static_cast<size_t>(pp_rank)];
    if (k.over > 0) {
      EXPECT_GE(predicted, measured) << k.name << " rank " << w;
      EXPECT_LE(predicted / measured, 1 + k.over) << k.name << " rank " << w;
    }
    EXPECT_NEAR(predicted / measured, 1.0,
                k.over > 0 ? k.over
                : k.ep > 1 ? 0.15
                           : 0.10)
        << k.name << " rank " << w << "\n"
        << res.memory_reports[static_cast<size_t>(w)] << "\nplanned: parameters " << t.parameters
        << " B, gradients " << t.gradients << " B, optimizer state " << t.optimizer_state
        << " B, activations " << t.activations << " B, buffers " << t.buffers << " B";
  }
  const double dp_sent = res.comm_bytes_per_step - res.tp_bytes_per_step;
  std::printf("%-28s data-parallel bytes per step: measured %.0f, planned %.0f\n", k.name.c_str(),
              dp_sent, p.dp_bytes);
  EXPECT_NEAR(p.dp_bytes, dp_sent, 1e-9 * dp_sent + 1e-6) << k.name;
  if (k.cp > 1)
    std::printf("%-28s context-parallel bytes per step: measured %.0f, planned %.0f\n",
                k.name.c_str(), res.cp_bytes_per_step, p.cp_bytes);
  EXPECT_NEAR(p.cp_bytes, res.cp_bytes_per_step, 1e-9 * res.cp_bytes_per_step + 1e-6) << k.name;
}

// Context-parallel layouts: `base` with cp 2 and each --cp-comm (named "<name>_<comm>").
std::vector<Case> with_cp(const Case& base) {
  std::vector<Case> out;
  for (const char* comm : {"allgather", "ring", "ulysses"}) {
    Case c = base;
    c.name += std::string("_") + comm;
    c.cp = 2;
    c.cp_comm = comm;
    out.push_back(c);
  }
  return out;
}

std::vector<Case> cp_cases() {
  std::vector<Case> bases;
  bases.push_back({"cp2"});  // one replica, micro-batches of 8 sequences
  Case c;
  c.name = "cp2_mb1", c.micro_batch = 1;  // one sequence a micro-batch (no reordering copies)
  bases.push_back(c);
  c = {};
  c.name = "llama_cp2", c.llama = true;
  bases.push_back(c);
  // ZeRO-3 plans the worst case of the engine's reductions, two in flight at every bucket
  // (drain(2)); a reduction that has completed is freed at the next bucket's end, and with the
  // attention's exchanges between buckets the one before last usually has, so at the attention's
  // peak these runs hold one bucket fewer than planned (seen in the allocator's holders at the
  // peak: the current bucket, the last one and the embedding's). Activations / cp leave the
  // buckets a larger share of the total: the plan is an upper bound here, within 20%.
  c = {};
  c.name = "llama_cp2_dp2_zero3_full", c.llama = true, c.dp = 2, c.zero = 3, c.recompute = "full";
  c.over = 0.20;
  bases.push_back(c);
  c = {};
  c.name = "cp2_dp2_zero2_m2_selective", c.dp = 2, c.zero = 2, c.micro_batch = 2;
  c.recompute = "selective";
  bases.push_back(c);
  c = {};
  c.name = "cp2_tp2_sp", c.tp = 2, c.sp = true;
  bases.push_back(c);
  c = {};
  c.name = "cp2_pp2_zb_h1", c.pp = 2, c.micro_batch = 2, c.schedule = "zb-h1";
  bases.push_back(c);
  std::vector<Case> out;
  for (const Case& b : bases)
    for (const Case& k : with_cp(b)) out.push_back(k);
  c = {};  // a mixture of experts' routing, all-gathered over the cp ranks
  c.name = "moe_cp2_dp2_ep2_ring", c.dp = 2, c.ep = 2, c.experts = 4, c.cp = 2, c.cp_comm = "ring";
  out.push_back(c);
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> v = {
      {"one_rank"},
      {"one_rank_selective_m2", 1, 1, 1, 0, 4, 1, "1f1b", "selective"},
      {"dp2_zero0", 2},
      {"dp2_zero1_full", 2, 1, 1, 1, 0, 1, "1f1b", "full"},
      {"dp2_zero2_m2", 2, 1, 1, 2, 2},
      {"dp2_zero3", 2, 1, 1, 3},
      {"tp2", 1, 2},
      {"dp2_tp2_zero1", 2, 2, 1, 1},
      {"pp2_gpipe_m4", 1, 1, 2, 0, 2, 1, "gpipe"},
      {"pp2_1f1b_m8_full", 1, 1, 2, 0, 1, 1, "1f1b", "full"},
      {"pp2_interleaved_v2", 1, 1, 2, 0, 2, 2, "interleaved"},
      {"pp2_zb_h1_selective", 1, 1, 2, 0, 2, 1, "zb-h1", "selective"},
      {"pp2_dp2_tp2_zero1_1f1b", 2, 2, 2, 1, 1, 1, "1f1b"},
      {"pp2_dp2_zero3_interleaved", 2, 1, 2, 3, 2, 2, "interleaved"},
      {"pp2_1f1b_mid_block", 1, 1, 2, 0, 2, 1, "1f1b", "none", 3},
      {"pp2_zb_h1_mid_block_full", 1, 1, 2, 0, 2, 1, "zb-h1", "full", 3},
      {"pp2_dp2_tp2_mid_block_selective", 2, 2, 2, 1, 2, 1, "1f1b", "selective", 3},
      {"dp2_zero3_m2_bf16", 2, 1, 1, 3, 2, 1, "1f1b", "none", 4, "bf16"},
      // HSDP with bf16 gradient reductions: the shards' all-reduce over their replicas stays fp32.
      {"dp4_zero3_hsdp2_bf16",
       4,
       1,
       1,
       3,
       0,
       1,
       "1f1b",
       "none",
       4,
       "bf16",
       false,
       1,
       0,
       0.0f,
       "auto",
       false,
       1,
       "allgather",
       0,
       "2",
       DType::BF16},
      {"pp2_dp2_tp2_zero3", 2, 2, 2, 3, 2, 1, "1f1b", "none", 4},
      {"pp2_dp2_tp2_zero3_bf16", 2, 2, 2, 3, 2, 1, "1f1b", "none", 4, "bf16"},
      {"pp2_zb_h1_bf16", 1, 1, 2, 0, 2, 1, "zb-h1", "none", 4, "bf16"},
      {"pp2_zb_h1_bf16_weight_copies", 1, 1, 2, 0, 2, 1, "zb-h1", "none", 4, "bf16", false, 1, 0,
       0.0f, "on"},
      {"moe_dp2_ep2_zero1_bf16_weight_copies", 2, 1, 1, 1, 0, 1, "1f1b", "none", 4, "bf16", false,
       2, 4, 0.0f, "on"},
      {"tp2_sp", 1, 2, 1, 0, 0, 1, "1f1b", "none", 4, "fp32", true},
      {"dp2_tp2_sp_zero1_selective", 2, 2, 1, 1, 0, 1, "1f1b", "selective", 4, "fp32", true},
      {"pp2_tp2_sp_full", 1, 2, 2, 0, 2, 1, "1f1b", "full", 4, "fp32", true},
      {"moe_one_rank", 1, 1, 1, 0, 0, 1, "1f1b", "none", 4, "fp32", false, 1, 4},
      {"moe_dp2_ep2", 2, 1, 1, 0, 0, 1, "1f1b", "none", 4, "fp32", false, 2, 4},
      {"moe_dp2_ep2_zero3_capacity", 2, 1, 1, 3, 0, 1, "1f1b", "none", 4, "fp32", false, 2, 4,
       1.25f},
      {"moe_dp2_tp2_ep2_full", 2, 2, 1, 1, 0, 1, "1f1b", "full", 4, "fp32", false, 2, 4},
      {"moe_pp2_dp2_ep2", 2, 1, 2, 0, 2, 1, "1f1b", "none", 4, "fp32", false, 2, 4},
      {"llama_one_rank", 1, 1, 1, 0, 0, 1, "1f1b", "none", 4, "fp32", false, 1, 0, 0.0f, "auto",
       true},
      {"llama_tp2_sp_selective", 1, 2, 1, 0, 0, 1, "1f1b", "selective", 4, "fp32", true, 1, 0, 0.0f,
       "auto", true},
      {"llama_dp2_zero3_full", 2, 1, 1, 3, 0, 1, "1f1b", "full", 4, "fp32", false, 1, 0, 0.0f,
       "auto", true},
      {"llama_pp2_zb_h1", 1, 1, 2, 0, 2, 1, "zb-h1", "none", 4, "fp32", false, 1, 0, 0.0f, "auto",
       true},
      {"llama_pp2_dp2_tp2_zero1_bf16", 2, 2, 2, 1, 2, 1, "1f1b", "none", 4, "bf16", false, 1, 0,
       0.0f, "auto", true},
  };
  // ZeRO-3 on one stage: the plan counts the engine's worst case, two reductions in flight at every
  // bucket besides the gathered one (as cp_cases explains); how many a run holds at its peak
  // depends on its threads' timing (dp2_zero3_m2_bf16's buffers measured 655 KiB against 1045 KiB
  // planned, llama_dp2_zero3_full's 480-620 KiB against 750 KiB). Since the attention is fused
  // these small models keep no T x T probabilities, which had made the buckets a smaller share of
  // the peak: the plan is an upper bound here, within 20%.
  for (Case& c : v)
    if (c.zero == 3 && c.pp == 1 && c.over == 0) c.over = 0.20;
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layouts, MemoryValidation, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(ContextParallel, MemoryValidation, ::testing::ValuesIn(cp_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace tessera::plan
