// Pipeline schedules as data: the generators' lists, the validator's findings on broken lists,
// and the deadlock checker on lists that hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/parallel/pipeline/schedule_deadlock.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/parallel/pipeline/schedule_validate.h"

namespace tessera::parallel {
namespace {

// The --schedule values, as a user types them.
std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (ScheduleKind k : pipeline_schedules()) out.push_back(to_string(k));
  return out;
}

// A rank's actions as text, e.g. "recv F0 F0 send F0", optionally compute actions only.
std::string actions(const Schedule& s, int rank, bool compute_only = false) {
  std::string out;
  for (const Action& a : s.ranks[static_cast<size_t>(rank)]) {
    if (compute_only && !is_compute(a.kind)) continue;
    if (!out.empty()) out += ' ';
    out += to_string(a);
  }
  return out;
}

bool mentions(const std::vector<std::string>& problems, const std::string& text) {
  return std::any_of(problems.begin(), problems.end(),
                     [&](const std::string& p) { return p.find(text) != std::string::npos; });
}

std::string joined(const std::vector<std::string>& problems) {
  std::string out;
  for (const std::string& p : problems) out += p + "\n";
  return out;
}

std::string config_error(const std::string& name, int pp, int m, int v) {
  try {
    make_schedule(parse_schedule(name), pp, m, v);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ScheduleGenerators, OneFOneBListsWithTransfers) {
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 3);
  EXPECT_EQ(s.name, "1f1b");
  EXPECT_EQ(s.pp, 2);
  EXPECT_EQ(s.micro_batches, 3);
  EXPECT_EQ(actions(s, 0),
            "F0 send F0 F1 send F1 recv B0 B0 F2 send F2 recv B1 B1 recv B2 B2 reduce step");
  EXPECT_EQ(actions(s, 1),
            "recv F0 F0 B0 send B0 recv F1 F1 B1 send B1 recv F2 F2 B2 send B2 reduce step");
}

TEST(ScheduleGenerators, OneFOneBWarmUpIsCappedByMicroBatches) {
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 4, 2);
  EXPECT_EQ(actions(s, 0, true), "F0 F1 B0 B1");  // min(p - 1, m) = 2 warm-up forwards
  EXPECT_EQ(actions(s, 2, true), "F0 F1 B0 B1");  // warm-up 1, then F1 B0, then B1
  EXPECT_EQ(actions(s, 3, true), "F0 B0 F1 B1");
}

TEST(ScheduleGenerators, GPipeRunsAllForwardsFirst) {
  const Schedule s = make_schedule(ScheduleKind::GPipe, 3, 3);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(actions(s, r, true), "F0 F1 F2 B0 B1 B2") << r;
  EXPECT_EQ(actions(s, 1),
            "recv F0 F0 send F0 recv F1 F1 send F1 recv F2 F2 send F2 recv B0 B0 "
            "send B0 recv B1 B1 send B1 recv B2 B2 send B2 reduce step");
}

TEST(ScheduleGenerators, InterleavedGroupsMicroBatchesByChunk) {
  const Schedule s = make_schedule(ScheduleKind::Interleaved, 2, 4, 2);
  EXPECT_EQ(s.virtual_stages, 2);
  EXPECT_EQ(s.num_model_stages(), 4);
  // Rank 0 warms up with (v-1)*p + 2*(p-1) = 4 chunk-forwards; rank 1 (stages 1 and 3) with 2.
  EXPECT_EQ(actions(s, 0, true), "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  EXPECT_EQ(actions(s, 1, true), "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  // Stage 1 (rank 1, chunk 0) sends to stage 2 (rank 0, chunk 1); stage 3 is last: no send.
  const std::string r1 = actions(s, 1);
  EXPECT_NE(r1.find("recv F0 F0 send F0 "), std::string::npos) << r1;
  EXPECT_NE(r1.find("recv F0.1 F0.1 B0.1 send B0.1"), std::string::npos) << r1;
  // Stage 0 receives no activation; stage 2 receives from stage 1.
  const std::string r0 = actions(s, 0);
  EXPECT_EQ(r0.rfind("F0 send F0 ", 0), 0u) << r0;
  EXPECT_NE(r0.find("recv F0.1 F0.1 send F0.1"), std::string::npos) << r0;
}

TEST(ScheduleGenerators, ZeroBubbleH1DefersWeightGradients) {
  const Schedule s = make_schedule(ScheduleKind::ZeroBubbleH1, 4, 8);
  // Rank 0: warm-up of 3, then each W right after its BI (pp micro-batches in flight).
  EXPECT_EQ(actions(s, 0, true),
            "F0 F1 F2 F3 BI0 W0 F4 BI1 W1 F5 BI2 W2 F6 BI3 W3 F7 BI4 W4 BI5 W5 BI6 W6 BI7 W7");
  // The last rank lets W trail BI by 3 micro-batches and runs the leftover Ws at the end.
  EXPECT_EQ(actions(s, 3, true),
            "F0 BI0 F1 BI1 F2 BI2 F3 BI3 W0 F4 BI4 W1 F5 BI5 W2 F6 BI6 W3 F7 BI7 W4 W5 W6 W7");
  // BI carries the transfers; W none.
  EXPECT_NE(actions(s, 1).find("recv B0 BI0 send B0"), std::string::npos);
}

// Every generator, over many shapes: valid and free of deadlock.
TEST(ScheduleGenerators, AllValidAndDeadlockFree) {
  int checked = 0;
  for (const std::string& name : schedule_names())
    for (int pp = 1; pp <= 5; ++pp)
      for (int m = 1; m <= 11; ++m)
        for (int v = 1; v <= 3; ++v) {
          if ((name == "interleaved") != (v > 1)) continue;
          if (name == "interleaved" && (pp < 2 || m % pp != 0)) continue;
          const Schedule s = make_schedule(parse_schedule(name), pp, m, v);
          ASSERT_EQ(static_cast<int>(s.ranks.size()), pp);
          const std::vector<std::string> problems = validate_schedule(s);
          EXPECT_TRUE(problems.empty()) << name << " pp=" << pp << " m=" << m << " v=" << v << "\n"
                                        << joined(problems);
          const DeadlockReport d = check_deadlock(s);
          EXPECT_FALSE(d.deadlocked()) << name << " pp=" << pp << " m=" << m << ": " << d.message();
          for (const auto& list : s.ranks) {
            ASSERT_GE(list.size(), 2u);
            EXPECT_EQ(list[list.size() - 2].kind, ActionKind::ReduceGradients);
            EXPECT_EQ(list.back().kind, ActionKind::OptimizerStep);
          }
          ++checked;
        }
  EXPECT_EQ(checked, 3 * 5 * 11 + 2 * (5 + 3 + 2 + 2));  // interleaved: m % pp == 0, pp >= 2
}

TEST(ScheduleFactory, ClearErrors) {
  EXPECT_NE(config_error("pipedream", 2, 4, 1)
                .find("schedule must be gpipe, 1f1b, interleaved or zb-h1, got 'pipedream'"),
            std::string::npos);
  EXPECT_NE(config_error("1f1b", 2, 4, 2).find("virtual_stages need the interleaved schedule"),
            std::string::npos);
  EXPECT_NE(config_error("interleaved", 2, 4, 1).find("at least 2 virtual stages"),
            std::string::npos);
  const std::string not_multiple = config_error("interleaved", 4, 6, 2);
  EXPECT_NE(not_multiple.find("multiple of the pipeline size pp=4: 6 is not"), std::string::npos)
      << not_multiple;
  EXPECT_NE(not_multiple.find("next multiple is 8"), std::string::npos) << not_multiple;
  EXPECT_NE(config_error("interleaved", 1, 4, 2).find("at least 2 pipeline ranks"),
            std::string::npos);
  EXPECT_NE(config_error("gpipe", 0, 4, 1).find("at least 1 pipeline rank"), std::string::npos);
  EXPECT_NE(config_error("zb-h1", 2, 0, 1).find("at least 1 micro-batch"), std::string::npos);
  EXPECT_NE(config_error("1f1b", 2, 2, 0).find("at least 1"), std::string::npos);
  EXPECT_THROW(interleaved_schedule(2, 3, 2), ConfigError);
}

// Editing helpers for broken schedules.
void erase_action(Schedule& s, int rank, const std::string& name) {
  auto& list = s.ranks[static_cast<size_t>(rank)];
  auto it =
      std::find_if(list.begin(), list.end(), [&](const Action& a) { return to_string(a) == name; });
  ASSERT_NE(it, list.end()) << name;
  list.erase(it);
}
size_t position(const Schedule& s, int rank, const std::string& name) {
  const auto& list = s.ranks[static_cast<size_t>(rank)];
  for (size_t i = 0; i < list.size(); ++i)
    if (to_string(list[i]) == name) return i;
  ADD_FAILURE() << name << " not on rank " << rank;
  return 0;
}

// Moves the action `name` of `rank` to just after the action `after`.
void move_after(Schedule& s, int rank, const std::string& name, const std::string& after) {
  auto& list = s.ranks[static_cast<size_t>(rank)];
  const Action a = list[position(s, rank, name)];
  erase_action(s, rank, name);
  list.insert(list.begin() + static_cast<long>(position(s, rank, after)) + 1, a);
}

TEST(ScheduleValidate, GeneratedAndSingleStageAreValid) {
  EXPECT_TRUE(validate_schedule(single_stage_schedule(3)).empty());
  EXPECT_NO_THROW(check_schedule(make_schedule(ScheduleKind::ZeroBubbleH1, 3, 5)));
}

TEST(ScheduleValidate, MissingSendHasNoMatch) {
  Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 3);
  erase_action(s, 0, "send F1");
  const auto problems = validate_schedule(s);
  EXPECT_TRUE(mentions(problems, "rank 0 (stage 0): send F1 runs 0 times")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "rank 1: recv F1 from stage 0 on rank 0 has no matching send"))
      << joined(problems);
  try {
    check_schedule(s);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the 1f1b schedule is invalid"), std::string::npos);
  }
}

TEST(ScheduleValidate, ComputeCountsAndOrder) {
  Schedule s = make_schedule(ScheduleKind::GPipe, 2, 2);
  auto& r0 = s.ranks[0];
  // Run B1 before F1 on rank 0 and F0 twice.
  std::swap(r0[position(s, 0, "F1")], r0[position(s, 0, "B1")]);
  r0.insert(r0.begin(), Action{ActionKind::Forward, 0, 0});
  const auto problems = validate_schedule(s);
  EXPECT_TRUE(mentions(problems, "rank 0 (stage 0): F0 runs 2 times")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "rank 0 (stage 0): B1 comes before F1")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "send F1 must come after F1")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "recv B1 must come before B1")) << joined(problems);
}

TEST(ScheduleValidate, SplitBackwardRules) {
  Schedule s = make_schedule(ScheduleKind::ZeroBubbleH1, 2, 2);
  auto& r1 = s.ranks[1];
  // Rank 1: W0 before BI0, and an extra whole B1 besides BI1 + W1.
  std::swap(r1[position(s, 1, "BI0")], r1[position(s, 1, "W0")]);
  r1.insert(r1.begin() + static_cast<long>(position(s, 1, "W1")),
            Action{ActionKind::Backward, 1, 0});
  const auto problems = validate_schedule(s);
  EXPECT_TRUE(mentions(problems, "rank 1 (stage 1): W0 comes before BI0")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "both B1 and BI1")) << joined(problems);
}

TEST(ScheduleValidate, TransfersOnlyWhereStagesBorder) {
  Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 1);
  auto& r0 = s.ranks[0];
  r0.insert(r0.begin(), Action{ActionKind::RecvForward, 0, 0});  // stage 0 receives nothing
  auto& r1 = s.ranks[1];
  r1.insert(r1.begin() + 2, Action{ActionKind::SendForward, 0, 0});  // nor does the last send on
  const auto problems = validate_schedule(s);
  EXPECT_TRUE(mentions(problems, "recv F0 on the first stage, which has no previous stage"))
      << joined(problems);
  EXPECT_TRUE(mentions(problems, "send F0 on the last stage, which has no next stage"))
      << joined(problems);
}

TEST(ScheduleValidate, ReceivesInTheOrderOfTheSends) {
  Schedule s = make_schedule(ScheduleKind::GPipe, 2, 2);
  auto& r1 = s.ranks[1];
  // Rank 1 runs its backwards in the other order: it sends B1 before B0, rank 0 expects B0.
  std::swap(r1[position(s, 1, "B0")], r1[position(s, 1, "B1")]);
  std::swap(r1[position(s, 1, "send B0")], r1[position(s, 1, "send B1")]);
  const auto problems = validate_schedule(s);
  ASSERT_EQ(problems.size(), 1u) << joined(problems);
  EXPECT_EQ(problems[0],
            "rank 1 sends gradients to rank 0 in another order than rank 0 receives them: "
            "transfer 1 is send B1 but rank 0 expects recv B0");
  // With tagged, asynchronous sends it still runs to the end.
  EXPECT_FALSE(check_deadlock(s).deadlocked());
}

// An executor may keep a chunk's input gradient in one buffer that each backward overwrites, so
// micro-batch m's gradient must leave before the chunk's next backward (B or BI of another
// micro-batch): sent after it, the next micro-batch's gradient could leave in its place. Later
// than right after its own backward is fine.
TEST(ScheduleValidate, InputGradientLeavesBeforeTheNextBackward) {
  Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 3);
  move_after(s, 1, "send B0", "B1");  // rank 1: ... B1 send B0 send B1 ...
  std::vector<std::string> problems = validate_schedule(s);
  ASSERT_EQ(problems.size(), 1u) << joined(problems);
  EXPECT_EQ(problems[0],
            "rank 1 (stage 1): send B0 must come before B1, chunk 0's next backward, which may "
            "overwrite micro-batch 0's input gradient");
  EXPECT_FALSE(check_deadlock(s).deadlocked());  // it runs to the end: only this rule catches it

  Schedule zb = make_schedule(ScheduleKind::ZeroBubbleH1, 3, 4);
  move_after(zb, 1, "send B1", "BI2");
  problems = validate_schedule(zb);
  ASSERT_EQ(problems.size(), 1u) << joined(problems);
  EXPECT_EQ(problems[0],
            "rank 1 (stage 1): send B1 must come before BI2, chunk 0's next backward, which may "
            "overwrite micro-batch 1's input gradient");

  Schedule il = make_schedule(ScheduleKind::Interleaved, 2, 4, 2);
  move_after(il, 0, "send B0.1", "B1.1");
  problems = validate_schedule(il);
  ASSERT_EQ(problems.size(), 1u) << joined(problems);
  EXPECT_EQ(problems[0],
            "rank 0 (stage 2): send B0.1 must come before B1.1, chunk 1's next backward, which may "
            "overwrite micro-batch 0's input gradient");

  // After other actions, but before the next backward: valid. So is a last W before the send.
  Schedule late = make_schedule(ScheduleKind::OneFOneB, 2, 3);
  move_after(late, 1, "send B0", "F1");
  EXPECT_TRUE(validate_schedule(late).empty()) << joined(validate_schedule(late));
  Schedule after_w = make_schedule(ScheduleKind::ZeroBubbleH1, 2, 2);
  move_after(after_w, 1, "send B1", "W1");
  EXPECT_TRUE(validate_schedule(after_w).empty()) << joined(validate_schedule(after_w));
}

TEST(ScheduleValidate, ReduceAndStepEndEveryRank) {
  Schedule s = make_schedule(ScheduleKind::ZeroBubbleH1, 2, 2);
  auto& r0 = s.ranks[0];
  r0.pop_back();                                    // no OptimizerStep
  std::swap(r0[r0.size() - 1], r0[r0.size() - 2]);  // W1 after ReduceGradients
  s.ranks[1].push_back(Action{ActionKind::Forward, 5, 0});
  const auto problems = validate_schedule(s);
  EXPECT_TRUE(mentions(problems, "rank 0: OptimizerStep runs 0 times")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "rank 0: W1 comes after ReduceGradients")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "rank 1: action 12 (F5, chunk 0) is outside")) << joined(problems);
  EXPECT_TRUE(mentions(problems, "rank 1: OptimizerStep must be the last action"))
      << joined(problems);
}

TEST(ScheduleValidate, ShapeMismatch) {
  Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 2);
  s.ranks.pop_back();
  const auto problems = validate_schedule(s);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0], "the schedule has action lists for 1 ranks but 2 pipeline ranks");
}

// Rank 0 waits for micro-batch 0's gradient before sending its activation; rank 1 waits for the
// activation. Structurally valid, but the two wait for each other.
Schedule crossed_waits() {
  Schedule s;
  s.name = "crossed";
  s.pp = 2;
  s.micro_batches = 1;
  using K = ActionKind;
  s.ranks = {{{K::Forward, 0, 0},
              {K::RecvBackward, 0, 0},
              {K::SendForward, 0, 0},
              {K::Backward, 0, 0},
              {K::ReduceGradients, -1, 0},
              {K::OptimizerStep, -1, 0}},
             {{K::RecvForward, 0, 0},
              {K::Forward, 0, 0},
              {K::Backward, 0, 0},
              {K::SendBackward, 0, 0},
              {K::ReduceGradients, -1, 0},
              {K::OptimizerStep, -1, 0}}};
  return s;
}

TEST(ScheduleDeadlock, CycleNamesBothRanks) {
  const Schedule s = crossed_waits();
  EXPECT_TRUE(validate_schedule(s).empty()) << joined(validate_schedule(s));
  const DeadlockReport d = check_deadlock(s);
  ASSERT_TRUE(d.deadlocked());
  ASSERT_EQ(d.stuck.size(), 2u);
  EXPECT_EQ(d.stuck[0].rank, 0);
  EXPECT_EQ(d.stuck[0].index, 1u);
  EXPECT_EQ(d.stuck[0].action, (Action{ActionKind::RecvBackward, 0, 0}));
  EXPECT_EQ(d.stuck[0].peer, 1);
  EXPECT_EQ(d.stuck[1].rank, 1);
  EXPECT_EQ(d.stuck[1].index, 0u);
  EXPECT_EQ(d.stuck[1].peer, 0);
  EXPECT_EQ(d.message(),
            "deadlock: rank 0 waits at action 1 (recv B0) for rank 1: rank 1 is itself stuck at "
            "recv F0 (action 0) before its send B0 (action 3); rank 1 waits at action 0 (recv F0) "
            "for rank 0: rank 0 is itself stuck at recv B0 (action 1) before its send F0 "
            "(action 2)");
}

TEST(ScheduleDeadlock, ThreeRankCycleAndMissingSend) {
  // GPipe on 3 ranks where the middle rank receives the gradient of micro-batch 0 before it sends
  // the activation of micro-batch 1, which the last rank needs first: rank 1 waits for rank 2,
  // rank 2 for rank 1, and rank 0, waiting for rank 1's gradient, is stuck behind them.
  Schedule s = make_schedule(ScheduleKind::GPipe, 3, 2);
  auto& r1 = s.ranks[1];
  const Action recv_b0 = r1[position(s, 1, "recv B0")];
  r1.erase(r1.begin() + static_cast<long>(position(s, 1, "recv B0")));
  r1.insert(r1.begin() + static_cast<long>(position(s, 1, "send F1")), recv_b0);
  const DeadlockReport d = check_deadlock(s);
  ASSERT_TRUE(d.deadlocked());
  ASSERT_EQ(d.stuck.size(), 3u) << d.message();
  EXPECT_EQ(to_string(d.stuck[0].action), "recv B0");
  EXPECT_EQ(to_string(d.stuck[1].action), "recv B0");
  EXPECT_EQ(to_string(d.stuck[2].action), "recv F1");
  EXPECT_EQ(d.stuck[2].peer, 1);

  Schedule lost = make_schedule(ScheduleKind::OneFOneB, 2, 2);
  erase_action(lost, 1, "send B1");
  const DeadlockReport d2 = check_deadlock(lost);
  ASSERT_EQ(d2.stuck.size(), 1u) << d2.message();
  EXPECT_EQ(d2.stuck[0].rank, 0);
  EXPECT_EQ(d2.stuck[0].reason, "rank 1 finished without sending it");
}

TEST(ScheduleDeadlock, NoDeadlockMessage) {
  EXPECT_EQ(check_deadlock(make_schedule(ScheduleKind::OneFOneB, 4, 8)).message(),
            "no deadlock: every rank runs to the end");
}

}  // namespace
}  // namespace tessera::parallel
