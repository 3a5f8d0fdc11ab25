// The simulator against the closed-form bubbles and activation peaks of each schedule, with equal
// stage costs and no transfer latency (where those formulas hold exactly), plus timing details.
#include "tessera/parallel/pipeline/schedule_simulate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>

#include "tessera/core/error.h"
#include "tessera/parallel/pipeline/schedule_generators.h"

namespace tessera::parallel {
namespace {

// The --schedule values, as a user types them.
std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (ScheduleKind k : pipeline_schedules()) out.push_back(to_string(k));
  return out;
}

constexpr double kExact = 1e-12;

// The timed action `name` ("F0", "BI3", ...) on `rank`.
const TimedAction& timed(const Simulation& sim, int rank, const std::string& name) {
  for (const TimedAction& t : sim.ranks[static_cast<size_t>(rank)])
    if (to_string(t.action) == name) return t;
  throw std::runtime_error(name + " did not run on rank " + std::to_string(rank));
}

void expect_bubble(const Simulation& sim, double expected, const std::string& what) {
  ASSERT_FALSE(sim.deadlock.deadlocked()) << what << ": " << sim.deadlock.message();
  EXPECT_NEAR(sim.bubble_overall, expected, kExact) << what;
  for (size_t r = 0; r < sim.bubble.size(); ++r)
    EXPECT_NEAR(sim.bubble[r], expected, kExact) << what << " rank " << r;
}

struct Shape {
  int p, m;
};
// p in {2, 4}; m in {p, 2p + 1, 8}.
const Shape kShapes[] = {{2, 2}, {2, 5}, {2, 8}, {4, 4}, {4, 9}, {4, 8}};

std::string label(const std::string& name, Shape s) {
  return name + " p=" + std::to_string(s.p) + " m=" + std::to_string(s.m);
}

// GPipe and 1F1B: idle (p - 1)(F + B) of a step (m + p - 1)(F + B) on every rank, whatever F
// and B are.
TEST(ScheduleSimulate, GPipeAndOneFOneBBubble) {
  for (const Shape sh : kShapes)
    for (const char* name : {"gpipe", "1f1b"})
      for (const ActionCosts costs : {ActionCosts{}, ActionCosts{1.5, 4, 1}}) {
        const Simulation sim = simulate(make_schedule(parse_schedule(name), sh.p, sh.m), costs);
        const double f_b = costs.forward + costs.backward;
        expect_bubble(sim, (sh.p - 1.0) / (sh.m + sh.p - 1.0), label(name, sh));
        EXPECT_NEAR(sim.makespan, (sh.m + sh.p - 1) * f_b, kExact) << label(name, sh);
        for (double b : sim.busy) EXPECT_NEAR(b, sh.m * f_b, kExact);
      }
}

// Interleaved, v = 2: each chunk action takes 1/v of the stage's time, the fill and drain shrink
// to (p - 1)(F + B) / v, so idle / step = (p - 1) / (v m + p - 1) (idle / compute = (p - 1)/(v m),
// the paper's form). m = 2p + 1 is not allowed (m must be a multiple of p).
TEST(ScheduleSimulate, InterleavedBubble) {
  for (const Shape sh : kShapes) {
    if (sh.m % sh.p != 0) {
      EXPECT_THROW(make_schedule(ScheduleKind::Interleaved, sh.p, sh.m, 2), ConfigError);
      continue;
    }
    for (int v : {2, 3}) {
      const Simulation sim = simulate(make_schedule(ScheduleKind::Interleaved, sh.p, sh.m, v));
      const std::string what = label("interleaved", sh) + " v=" + std::to_string(v);
      expect_bubble(sim, (sh.p - 1.0) / (v * sh.m + sh.p - 1.0), what);
      EXPECT_NEAR(sim.makespan, 3.0 * sh.m + 3.0 * (sh.p - 1) / v, kExact) << what;
    }
  }
}

// ZB-H1, Qi et al. 2024 table 2: bubble (p - 1)(T_F + T_B - T_W) per rank, T_B being BI's time.
// With T_F = T_BI = T_W = 1 (costs F=1, B=2, W=1) the step is 3m + p - 1 and the bubble fraction
// (p - 1) / (3m + p - 1), against (p - 1)(T_F + T_B + T_W) = 3(p - 1) for 1F1B.
TEST(ScheduleSimulate, ZeroBubbleH1Bubble) {
  for (const Shape sh : kShapes) {
    const Simulation sim = simulate(make_schedule(ScheduleKind::ZeroBubbleH1, sh.p, sh.m));
    expect_bubble(sim, (sh.p - 1.0) / (3.0 * sh.m + sh.p - 1.0), label("zb-h1", sh));
    EXPECT_NEAR(sim.makespan, 3.0 * sh.m + (sh.p - 1), kExact);
    const Simulation base = simulate(make_schedule(ScheduleKind::OneFOneB, sh.p, sh.m));
    EXPECT_NEAR(base.makespan - base.busy[0], 3.0 * (sh.p - 1), kExact);
    EXPECT_NEAR(sim.makespan - sim.busy[0], (base.makespan - base.busy[0]) / 3, kExact);
  }
  // Table 2 with unequal costs: T_F = 2, T_BI = 1.5, T_W = 1 (B = 2.5) on p=4, m=8.
  const Simulation sim =
      simulate(make_schedule(ScheduleKind::ZeroBubbleH1, 4, 8), ActionCosts{2, 2.5, 1});
  EXPECT_NEAR(sim.makespan - sim.busy[0], 3 * (2 + 1.5 - 1), kExact);
}

TEST(ScheduleSimulate, PeakMicroBatchesInFlight) {
  for (const Shape sh : kShapes) {
    const Simulation gpipe = simulate(make_schedule(ScheduleKind::GPipe, sh.p, sh.m));
    const Simulation one = simulate(make_schedule(ScheduleKind::OneFOneB, sh.p, sh.m));
    const Simulation zb = simulate(make_schedule(ScheduleKind::ZeroBubbleH1, sh.p, sh.m));
    ASSERT_EQ(one.peak_in_flight.size(), static_cast<size_t>(sh.p));
    for (int s = 0; s < sh.p; ++s) {
      EXPECT_EQ(gpipe.peak_in_flight[s], sh.m) << label("gpipe", sh) << " stage " << s;
      EXPECT_EQ(one.peak_in_flight[s], std::min(sh.p - s, sh.m)) << label("1f1b", sh) << s;
      // ZB-H1: every stage up to p, the peak 1F1B has on its first stage.
      EXPECT_EQ(zb.peak_in_flight[s], std::min(sh.p, sh.m)) << label("zb-h1", sh) << s;
      EXPECT_EQ(one.peak_rank_activations[s], one.peak_in_flight[s]);
    }
  }
  // Interleaved: rank r holds its warm-up plus one chunk-micro-batches, (v-1)p + 2(p-r-1) + 1,
  // each 1/v of the rank's activations (5.5 micro-batches on rank 0 for p=4, v=2, against 4).
  const Simulation il = simulate(make_schedule(ScheduleKind::Interleaved, 4, 8, 2));
  ASSERT_EQ(il.peak_in_flight.size(), 8u);
  for (int r = 0; r < 4; ++r)
    EXPECT_DOUBLE_EQ(il.peak_rank_activations[r], (4 + 2 * (4 - r - 1) + 1) / 2.0) << r;
  EXPECT_EQ(il.peak_in_flight[7], 1);  // the last stage runs F B F B ...
}

// closed_form_bubble states the formulas above; it agrees with the simulation wherever it claims
// to hold, including unequal costs, and declines where it does not.
TEST(ScheduleSimulate, ClosedFormsAgree) {
  const ActionCosts costs[] = {{}, {1.5, 4, 1}, {2, 3.5, 1}, {1, 2, 1.5}};
  int compared = 0;
  for (const Shape sh : kShapes)
    for (const std::string& name : schedule_names())
      for (const ActionCosts& c : costs) {
        const int v = name == "interleaved" ? 2 : 1;
        if (name == "interleaved" && sh.m % sh.p != 0) continue;
        const Schedule s = make_schedule(parse_schedule(name), sh.p, sh.m, v);
        const std::optional<double> formula = closed_form_bubble(s, c);
        if (!formula) continue;
        EXPECT_NEAR(simulate(s, c).bubble_overall, *formula, kExact) << label(name, sh);
        ++compared;
      }
  EXPECT_EQ(compared, 6 * 4 * 2 + 4 * 4 + 6 * 3);  // zb-h1 declines W > BI (1, 2, 1.5)
  ActionCosts latency;
  latency.p2p = 0.1;
  EXPECT_FALSE(closed_form_bubble(make_schedule(ScheduleKind::OneFOneB, 2, 2), latency));
  EXPECT_FALSE(
      closed_form_bubble(make_schedule(ScheduleKind::ZeroBubbleH1, 4, 3), ActionCosts{}));  // m < p
}

TEST(ScheduleSimulate, TimesOfActions) {
  // 1F1B, p=2, m=2, F=1, B=2: rank 0 F0 [0,1] F1 [1,2]; rank 1 F0 [1,2] B0 [2,4] F1 [4,5]
  // B1 [5,7]; rank 0 B0 [4,6] B1 [7,9].
  const Simulation sim = simulate(make_schedule(ScheduleKind::OneFOneB, 2, 2));
  EXPECT_EQ(timed(sim, 0, "F1").start, 1);
  EXPECT_EQ(timed(sim, 1, "F0").start, 1);
  EXPECT_EQ(timed(sim, 1, "B0").end, 4);
  EXPECT_EQ(timed(sim, 1, "F1").start, 4);
  EXPECT_EQ(timed(sim, 0, "recv B0").start, 2);  // waits from 2 ...
  EXPECT_EQ(timed(sim, 0, "recv B0").end, 4);    // ... until rank 1 posts the gradient
  EXPECT_EQ(timed(sim, 0, "B0").start, 4);
  EXPECT_EQ(timed(sim, 0, "B1").end, 9);
  EXPECT_EQ(sim.makespan, 9);
}

TEST(ScheduleSimulate, TransferLatencyAndStepCosts) {
  ActionCosts c;
  c.p2p = 0.5;
  c.optimizer = 0.25;
  c.reduce = 0.125;
  // GPipe, p=2, m=1: F 1, transfer 0.5, F 1, B 2, transfer 0.5, B 2, then reduce and step.
  const Simulation sim = simulate(make_schedule(ScheduleKind::GPipe, 2, 1), c);
  EXPECT_DOUBLE_EQ(timed(sim, 1, "F0").start, 1.5);
  EXPECT_DOUBLE_EQ(timed(sim, 0, "B0").start, 5);
  EXPECT_DOUBLE_EQ(sim.makespan, 7.375);
  EXPECT_DOUBLE_EQ(sim.busy[0], 3.375);
  EXPECT_DOUBLE_EQ(sim.bubble[0], 4 / 7.375);
}

TEST(ScheduleSimulate, CostsParsingAndChecks) {
  const ActionCosts c = parse_costs("1,2.5,0.5");
  EXPECT_EQ(c.forward, 1);
  EXPECT_EQ(c.backward, 2.5);
  EXPECT_EQ(c.weight, 0.5);
  EXPECT_THROW(parse_costs("1,2"), ConfigError);
  EXPECT_THROW(parse_costs("1,x,1"), ConfigError);
  EXPECT_THROW(parse_costs("1,2,1,"), ConfigError);
  try {
    simulate(make_schedule(ScheduleKind::ZeroBubbleH1, 2, 2), ActionCosts{1, 1, 1});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("W cost (1) must be smaller than the whole backward B"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(
      simulate(make_schedule(ScheduleKind::OneFOneB, 2, 2), ActionCosts{1, 1, 1}));  // no split
  EXPECT_THROW(simulate(make_schedule(ScheduleKind::OneFOneB, 2, 2), ActionCosts{0, 1, 0}),
               ConfigError);
}

TEST(ScheduleSimulate, CostsPerRank) {
  // GPipe, p=2, m=1, rank 0 F=1 B=2, rank 1 (twice as slow) F=2 B=4: F0 [0,1], F0 [1,3],
  // B0 [3,7], B0 [7,9].
  const std::vector<ActionCosts> costs = parse_rank_costs("1,2,1/2,4,1");
  ASSERT_EQ(costs.size(), 2u);
  EXPECT_EQ(costs[1].forward, 2);
  const Simulation sim = simulate(make_schedule(ScheduleKind::GPipe, 2, 1), costs);
  EXPECT_EQ(timed(sim, 1, "B0").end, 7);
  EXPECT_EQ(timed(sim, 0, "B0").start, 7);
  EXPECT_EQ(sim.makespan, 9);
  EXPECT_DOUBLE_EQ(sim.bubble[0], 6.0 / 9);
  EXPECT_DOUBLE_EQ(sim.bubble[1], 3.0 / 9);
  // The same costs on every rank, given once or per rank, simulate the same.
  const Schedule zb = make_schedule(ScheduleKind::ZeroBubbleH1, 4, 8);
  EXPECT_DOUBLE_EQ(simulate(zb, parse_rank_costs("1,2,1/1,2,1/1,2,1/1,2,1")).bubble_overall,
                   simulate(zb, ActionCosts{}).bubble_overall);
  EXPECT_THROW(simulate(zb, parse_rank_costs("1,2,1/1,2,1")), ConfigError);  // 2 of 4 ranks
  EXPECT_THROW(parse_rank_costs("1,2,1/"), ConfigError);
}

TEST(ScheduleSimulate, DeadlockedScheduleReportsWhatRan) {
  Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 2);
  auto& r0 = s.ranks[0];
  r0.erase(r0.begin() + 1);  // rank 0 never sends F0
  const Simulation sim = simulate(s);
  ASSERT_TRUE(sim.deadlock.deadlocked());
  EXPECT_NE(sim.deadlock.message().find("rank 1 waits at action 0 (recv F0) for rank 0"),
            std::string::npos)
      << sim.deadlock.message();
  EXPECT_TRUE(sim.ranks[1].empty());
  EXPECT_EQ(sim.ranks[0].size(), 3u);  // F0, F1, send F1; then it waits for B0
}

// Costs per model stage (the planner's unequal stages): equal ones reproduce the uniform
// simulation (a chunk's own cost is the rank's divided by v), a slower stage slows the step by
// its extra work on the critical path, and the in-flight counts need no costs at all.
TEST(ScheduleSimulate, PerStageCosts) {
  for (const std::string& name : schedule_names()) {
    const int v = name == "interleaved" ? 2 : 1;
    const Schedule s = make_schedule(parse_schedule(name), 4, 8, v);
    ActionCosts uniform;
    uniform.forward = 1;
    uniform.backward = 2;
    uniform.weight = 0.5;
    uniform.p2p = 0.1;
    ActionCosts chunk = uniform;
    chunk.forward /= v;
    chunk.backward /= v;
    chunk.weight /= v;
    const Simulation a = simulate(s, uniform);
    const Simulation b = simulate(
        s, std::vector<ActionCosts>(static_cast<size_t>(s.num_model_stages()), chunk), 0.1);
    EXPECT_NEAR(a.makespan, b.makespan, kExact) << name;
    EXPECT_NEAR(a.bubble_overall, b.bubble_overall, kExact) << name;
    const InFlight f = count_in_flight(s);
    EXPECT_EQ(f.peak_in_flight, a.peak_in_flight) << name;
    EXPECT_EQ(f.peak_rank_activations, a.peak_rank_activations) << name;
  }
  // GPipe, one stage twice as slow: every micro-batch queues behind it.
  const Schedule g = make_schedule(ScheduleKind::GPipe, 2, 4);
  std::vector<ActionCosts> costs(2);
  costs[1].forward = 2;
  costs[1].backward = 4;
  const Simulation sim = simulate(g, costs, 0);
  // Stage 1 runs 4 forwards (2 each) after stage 0's first, then 4 backwards (4 each); stage 0's
  // backwards follow the last: 1 + 8 + 16 + 2.
  EXPECT_NEAR(sim.makespan, 1 + 8 + 16 + 2, kExact);
  EXPECT_THROW(simulate(g, std::vector<ActionCosts>(3), 0), ConfigError);
}

}  // namespace
}  // namespace tessera::parallel
