// The data position travels with the checkpoint for any layout: a run resumed under another dp,
// tp, pp, ep or cp trains on the same global batches, in the same order, as the run that was never
// interrupted. The test records the tokens every rank fetches (set_batch_observer), assembles each
// step's global batch from the rows the ranks fetched (checking that ranks fetching the same row
// saw the same tokens and that every row was fetched), and compares the resumed run's batches with
// the uninterrupted run's, token for token. The training range is small, so that the resumed part
// crosses an epoch boundary (the sampler's (epoch, index) position and the next epoch's shuffle).
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tessera/data/sampler.h"
#include "tessera/io/checkpoint.h"
#include "tessera/train/trainer.h"
#include "train_fixture.h"

namespace tessera::train {
namespace {

using testing::temp_dir;
using testing::tiny_config;

struct Layout {
  int dp = 1, tp = 1, pp = 1, ep = 1, cp = 1, zero = 0;
  int micro_batch = 0;
};

std::string name_of(const Layout& l) {
  return "dp" + std::to_string(l.dp) + "_tp" + std::to_string(l.tp) + "_pp" + std::to_string(l.pp) +
         "_ep" + std::to_string(l.ep) + "_cp" + std::to_string(l.cp) + "_zero" +
         std::to_string(l.zero);
}

void apply(const Layout& l, TrainConfig& c) {
  c.dp = l.dp, c.tp = l.tp, c.pp = l.pp, c.ep = l.ep, c.cp = l.cp, c.zero = l.zero;
  c.micro_batch = l.micro_batch;
}

// Every step's global batch (rows in order, the inputs of each), as the ranks fetched it.
struct Stream {
  std::map<int64_t, std::map<int, std::vector<int32_t>>> rows;  // step -> global row -> tokens
  std::vector<std::string> conflicts;
};

struct Recorded {
  Stream stream;
  TrainResult result;
};

Recorded record(const TrainConfig& c) {
  Recorded out;
  std::mutex mu;
  set_batch_observer(
      [&](int rank, int64_t step, int first_row, int rows, int seq, const int32_t* inputs) {
        std::lock_guard<std::mutex> lock(mu);
        for (int r = 0; r < rows; ++r) {
          std::vector<int32_t> tokens(inputs + static_cast<size_t>(r) * seq,
                                      inputs + static_cast<size_t>(r + 1) * seq);
          auto [it, fresh] = out.stream.rows[step].emplace(first_row + r, tokens);
          if (!fresh && it->second != tokens)
            out.stream.conflicts.push_back("step " + std::to_string(step) + " row " +
                                           std::to_string(first_row + r) + " on rank " +
                                           std::to_string(rank));
        }
      });
  try {
    out.result = run_training(c, nullptr);
  } catch (...) {
    set_batch_observer(nullptr);
    throw;
  }
  set_batch_observer(nullptr);
  return out;
}

// The global batch of `step`: its `batch` rows' tokens, concatenated (a missing row fails).
std::vector<int32_t> global_batch(const Stream& s, int64_t step, int batch) {
  std::vector<int32_t> out;
  const auto it = s.rows.find(step);
  EXPECT_NE(it, s.rows.end()) << "step " << step << " fetched nothing";
  if (it == s.rows.end()) return out;
  EXPECT_EQ(it->second.size(), static_cast<size_t>(batch)) << "step " << step;
  for (int r = 0; r < batch; ++r) {
    const auto row = it->second.find(r);
    EXPECT_NE(row, it->second.end()) << "step " << step << " row " << r << " was not fetched";
    if (row != it->second.end()) out.insert(out.end(), row->second.begin(), row->second.end());
  }
  return out;
}

struct Case {
  const char* name;
  bool moe;
  Layout from, to;
};

void PrintTo(const Case& k, std::ostream* os) {
  *os << k.name;
}

class SampleStream : public ::testing::TestWithParam<Case> {};

TEST_P(SampleStream, ResumedUnderAnotherLayoutContinuesTheGlobalBatches) {
  const Case& k = GetParam();
  auto dir = temp_dir(std::string("stream_") + k.name);
  TrainConfig c = tiny_config(dir);
  c.steps = 12;
  c.batch = 4;
  c.val_fraction = 0.9;  // 33 windows, about 8 steps an epoch: steps 7-12 cross into epoch 1
  c.heads = 4;
  c.seq = 16;
  c.bucket_mb = 0.01;
  if (k.moe) {
    c.moe_experts = 4;
    c.moe_top_k = 2;
    c.moe_capacity_factor = 0;  // dropless
  }
  TrainConfig a = c;
  apply(k.from, a);
  a.save = (dir / "a").string();
  a.save_every = 6;
  const Recorded whole = record(a);
  ASSERT_TRUE(whole.stream.conflicts.empty()) << whole.stream.conflicts.front();
  ASSERT_EQ(whole.result.steps, 12);

  TrainConfig b = c;
  apply(k.to, b);
  b.resume = (dir / "a" / "step-00000006").string();
  const Recorded rest = record(b);
  ASSERT_TRUE(rest.stream.conflicts.empty()) << rest.stream.conflicts.front();
  ASSERT_EQ(rest.result.first_step, 6);
  EXPECT_EQ(rest.stream.rows.begin()->first, 6);
  EXPECT_EQ(rest.stream.rows.size(), 6u);
  for (int64_t step = 6; step < 12; ++step) {
    const std::vector<int32_t> want = global_batch(whole.stream, step, c.batch);
    const std::vector<int32_t> got = global_batch(rest.stream, step, c.batch);
    EXPECT_EQ(got, want) << "the global batch of step " << step + 1 << " differs after resuming "
                         << name_of(k.from) << " -> " << name_of(k.to);
    // Not just any stream: the batch of a step is not that of the step before.
    EXPECT_NE(got, global_batch(whole.stream, step - 1, c.batch));
  }
  // The epoch boundary was crossed in the resumed part (the position saved at step 6 is epoch
  // 0; the position after step 12 is in epoch 1).
  const io::LoadedCheckpoint at6 = io::load_checkpoint(dir / "a" / "step-00000006");
  const io::LoadedCheckpoint at12 = io::load_checkpoint(dir / "a" / "step-00000012");
  EXPECT_EQ(at6.state["sampler"]["epoch"], 0);
  EXPECT_EQ(at12.state["sampler"]["epoch"], 1);
}

Layout L(int dp, int tp, int pp, int ep, int cp, int zero = 0, int micro = 0) {
  return Layout{dp, tp, pp, ep, cp, zero, micro};
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SampleStream,
    ::testing::Values(Case{"dp1_to_dp2", false, L(1, 1, 1, 1, 1), L(2, 1, 1, 1, 1, 1)},
                      Case{"dp2_to_dp1", false, L(2, 1, 1, 1, 1, 3), L(1, 1, 1, 1, 1)},
                      Case{"pp1_to_pp2", false, L(1, 1, 1, 1, 1), L(1, 1, 2, 1, 1, 0, 1)},
                      Case{"tp1_to_tp2", false, L(1, 1, 1, 1, 1), L(1, 2, 1, 1, 1)},
                      Case{"cp1_to_cp2", false, L(1, 1, 1, 1, 1), L(1, 1, 1, 1, 2)},
                      Case{"ep1_to_ep2", true, L(2, 1, 1, 1, 1), L(2, 1, 1, 2, 1)},
                      Case{"dp2_pp2_to_tp2_cp2", false, L(2, 1, 2, 1, 1, 1, 1), L(1, 2, 1, 1, 2)}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tessera::train
