// The tessera engine measures a stage by building it against an allocator of address space only
// (plan/measure.h): the numbers are those of the same stage built in memory, for every kind of
// stage the trainer builds, and building one never touches the memory it counts (a write to it
// would fault).
#include "tessera/plan/measure.h"

#include <gtest/gtest.h>

#include <string>

#include "tessera/plan/engine.h"

namespace tessera::plan {
namespace {

struct Case {
  std::string name;
  Layout layout;
  parallel::UnitRange units;
  EngineOptions options;
  int experts = 0;
};

Layout layout(int dp, int tp, int pp, int zero, bool sp, nn::Recompute r, int ep = 1,
              parallel::ScheduleKind s = parallel::ScheduleKind::OneFOneB) {
  Layout l;
  l.dp = dp, l.tp = tp, l.pp = pp, l.ep = ep, l.sp = sp, l.recompute = r, l.schedule = s;
  l.zero = parallel::zero_stage(zero);
  l.micro_batch = 2;
  return l;
}

Layout with_cp(Layout l, int cp, nn::CpComm c = nn::CpComm::Ulysses) {
  l.cp = cp;
  l.cp_comm = c;
  return l;
}

TEST(MeasureStage, AddressSpaceOnlyGivesTheNumbersOfTheStageInMemory) {
  EngineOptions bf16;
  bf16.bf16_gemm_inputs = true;
  bf16.bf16_weight_copies = true;
  const std::vector<Case> cases = {
      {"whole model", layout(1, 1, 1, 0, false, nn::Recompute::None), {0, 5}, {}},
      {"tp2 sp zero1", layout(2, 2, 1, 1, true, nn::Recompute::Selective), {0, 5}, {}},
      {"zero3 full", layout(4, 1, 1, 3, false, nn::Recompute::Full), {0, 5}, {}},
      {"first stage cut mid-block, zb",
       layout(1, 1, 2, 0, false, nn::Recompute::None, 1, parallel::ScheduleKind::ZeroBubbleH1),
       {0, 2, false, true},
       {}},
      {"last stage from mid-block, full",
       layout(1, 2, 2, 2, true, nn::Recompute::Full, 1, parallel::ScheduleKind::ZeroBubbleH1),
       {2, 5, true, false},
       {}},
      {"bf16 inputs and weight copies",
       layout(1, 1, 1, 0, false, nn::Recompute::None),
       {0, 5},
       bf16},
      {"moe ep2", layout(2, 1, 1, 1, false, nn::Recompute::None, 2), {0, 5}, {}, 4},
      {"cp2 ulysses", with_cp(layout(1, 1, 1, 0, false, nn::Recompute::None), 2), {0, 5}, {}},
      {"cp4 ring tp2 sp selective",
       with_cp(layout(1, 2, 1, 0, true, nn::Recompute::Selective), 4, nn::CpComm::Ring),
       {0, 5},
       {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ModelSpec m;
    m.layers = 4, m.hidden = 32, m.heads = 4, m.seq = 16, m.vocab = 70, m.dropout = 0.1;
    m.moe.experts = c.experts;
    const StageMeasure planned = measure_stage(m, c.layout, c.units, c.options);
    const StageMeasure real = measure_stage(m, c.layout, c.units, c.options, Backing::Memory);
    EXPECT_EQ(planned.unit_elems, real.unit_elems);
    EXPECT_EQ(planned.dense_elems, real.dense_elems);
    EXPECT_EQ(planned.expert_elems, real.expert_elems);
    EXPECT_EQ(planned.record_bytes, real.record_bytes);
    EXPECT_EQ(planned.workspace_bytes, real.workspace_bytes);
    EXPECT_EQ(planned.deferred_bytes, real.deferred_bytes);
    EXPECT_EQ(planned.bf16_copy_bytes, real.bf16_copy_bytes);
    EXPECT_GT(planned.record_bytes, 0);
    EXPECT_EQ(static_cast<int>(planned.unit_elems.size()), c.units.last - c.units.first + 1);
    EXPECT_EQ(planned.bf16_copy_bytes > 0, c.options.bf16_weight_copies);
    EXPECT_EQ(planned.moe_blocks > 0, c.experts > 0);
  }
}

// A stage built over a context group of cp sizes its records and workspace for a cp rank's rows:
// / cp (the embedding's positions and the head's statistics too), its parameters unchanged.
TEST(MeasureStage, ContextParallelDividesRecordsAndWorkspace) {
  ModelSpec m;
  m.layers = 4, m.hidden = 32, m.heads = 4, m.seq = 64, m.vocab = 70;
  const Layout one = layout(1, 1, 1, 0, false, nn::Recompute::None);
  const StageMeasure a = measure_stage(m, one, {0, 5}, {});
  for (int cp : {2, 4}) {
    const StageMeasure b = measure_stage(m, with_cp(one, cp), {0, 5}, {});
    EXPECT_EQ(b.dense_elems, a.dense_elems);
    EXPECT_DOUBLE_EQ(b.record_bytes * cp, a.record_bytes) << cp;
    EXPECT_DOUBLE_EQ(b.workspace_bytes * cp, a.workspace_bytes) << cp;
  }
}

// What the record of a stage keeps changes with the recompute mode as the modules say (the
// planner no longer mirrors them by hand, so this is the check that it sees the difference).
TEST(MeasureStage, RecordsShrinkWithRecomputation) {
  ModelSpec m;
  m.layers = 4, m.hidden = 32, m.heads = 4, m.seq = 16, m.vocab = 70;
  double previous = 1e300;
  for (nn::Recompute r : {nn::Recompute::None, nn::Recompute::Selective, nn::Recompute::Full}) {
    const StageMeasure s = measure_stage(m, layout(1, 1, 1, 0, false, r), {0, 5}, {});
    EXPECT_LT(s.record_bytes, previous) << nn::to_string(r);
    previous = s.record_bytes;
  }
}

}  // namespace
}  // namespace tessera::plan
