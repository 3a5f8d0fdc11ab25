// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"):
// the activation memory per layer of table 2, for the four models of their table 3, reproduced by
// the planner's term-by-term count, and the first pipeline stage's total (section 4.3) from the
// schedule's micro-batches in flight.
#include "tessera/plan/korthikanti.h"

#include <gtest/gtest.h>

#include <vector>

#include "tessera/plan/engine.h"
#include "tessera/plan/planner.h"

namespace tessera::plan {
namespace {

using nn::Recompute;

// Table 3: attention heads, hidden size, layers, tensor- and pipeline-parallel size, micro-batch;
// s = 2048 and v = 51200 throughout.
struct PaperModel {
  const char* name;
  int a, h, L, t, p, b;
};
const std::vector<PaperModel> kModels = {{"22B", 64, 6144, 48, 8, 1, 4},
                                         {"175B", 96, 12288, 96, 8, 8, 1},
                                         {"530B", 128, 20480, 105, 8, 35, 1},
                                         {"1T", 160, 25600, 128, 8, 64, 1}};

LayerShape shape(const PaperModel& m, int t, bool sp) {
  LayerShape x;
  x.s = 2048;
  x.b = m.b;
  x.h = m.h;
  x.a = m.a;
  x.t = t;
  x.sp = sp;
  return x;
}

// The paper's formulas written out here, independently of the planner's code.
double paper(const PaperModel& m, int t, bool sp, Recompute r) {
  const double s = 2048, b = m.b, h = m.h, a = m.a, sbh = s * b * h;
  if (r == Recompute::Full) return 2 * sbh;
  const double attn = r == Recompute::None ? 5 * a * s / h : 0;
  if (t == 1) return sbh * (34 + attn);
  if (sp) return sbh * (34.0 / t + attn / t);
  return sbh * (10 + 24.0 / t + attn / t);
}

TEST(Korthikanti, PerLayerTermsSumToTable2ForEveryPaperModel) {
  for (const PaperModel& m : kModels)
    for (int t : {1, m.t})
      for (bool sp : {false, true})
        for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
          if (sp && t == 1) continue;
          if (r == Recompute::Full && sp) continue;  // table 2 lists full recomputation once
          const double want = paper(m, t, sp, r);
          EXPECT_NEAR(layer_activation_bytes(shape(m, t, sp), r), want, 1e-9 * want)
              << m.name << " t=" << t << " sp=" << sp << " " << nn::to_string(r);
          EXPECT_NEAR(table2_bytes(shape(m, t, sp), r), want, 1e-9 * want) << m.name;
        }
}

TEST(Korthikanti, FiveVariantsOfTheGpt3LayerInBytes) {
  // GPT-3 175B at t = 8, b = 1, s = 2048, h = 12288, a = 96: s b h = 25,165,824 and
  // 5 a s / h = 80, so the five rows of table 2 are s b h x (10 + 3 + 10), x (4.25 + 10), x 13,
  // x 4.25 and x 2.
  const PaperModel& m = kModels[1];
  const double sbh = 2048.0 * 12288;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(shape(m, 8, false), Recompute::None), sbh * 23);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(shape(m, 8, true), Recompute::None), sbh * 14.25);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(shape(m, 8, false), Recompute::Selective), sbh * 13);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(shape(m, 8, true), Recompute::Selective), sbh * 4.25);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(shape(m, 8, false), Recompute::Full), sbh * 2);
}

// Section 4.3: with 1F1B the first stage holds p micro-batches of L / p layers, so its activations
// are those of all L layers of one micro-batch; the interleaved schedule multiplies them by
// 1 + (p - 1) / (p m) with m the virtual stages (m >= 2). The planner gets the micro-batches in
// flight from the schedule, so this checks engine and schedule together.
TEST(Korthikanti, FirstStageHoldsAllLayersTimesTheInterleavingFactor) {
  for (const PaperModel& m : kModels) {
    if (m.p == 1) continue;
    for (int v : {1, 2}) {
      if (m.L % (m.p * v) != 0) continue;
      PlanRequest r;
      r.model.layers = m.L;
      r.model.hidden = m.h;
      r.model.heads = m.a;
      r.model.seq = 2048;
      r.model.vocab = 51200;
      r.model.dropout = 0.1;
      r.cluster = load_cluster("dgx-a100-80gb");
      r.global_batch = 2 * m.p;
      r.engine = "megatron";
      Layout l;
      l.tp = m.t;
      l.pp = m.p;
      l.dp = 1;
      l.sp = true;
      l.micro_batch = 1;
      l.recompute = Recompute::Selective;
      l.schedule = parallel::parse_schedule(v == 1 ? "1f1b" : "interleaved");
      l.virtual_stages = v;
      r.cluster = with_devices(r.cluster, l.devices());
      const Prediction p = plan_layout(r, l);
      ASSERT_TRUE(p.ok()) << p.problems.front();
      // The first stage's activations, less its embedding's dropout mask (section 4.3 keeps it
      // apart: s b h p / t with p micro-batches in flight).
      const LayerShape x = shape(m, m.t, true);
      const double factor = v == 1 ? 1.0 : 1 + (m.p - 1.0) / (m.p * v);
      const double layers = m.L * factor * layer_activation_bytes(x, Recompute::Selective);
      const double mask = p.in_flight[0] * embedding_activation_bytes(x);
      EXPECT_NEAR(p.rank_memory[0].activations - mask, layers, 1e-9 * layers)
          << m.name << " v=" << v;
      EXPECT_NEAR(layers, m.L * factor * 2048.0 * m.h * 34 / m.t, 1e-9 * layers);
    }
  }
}

}  // namespace
}  // namespace tessera::plan
