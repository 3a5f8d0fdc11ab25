// A rank's engines (parallel/rank_engines.h) on a small GPT over a Mesh of thread ranks, against
// the same GPT on one rank with the same global batch (no dropout):
//   * grad_norm() is the one-rank norm on every rank (dp=2 at ZeRO 0 and 3, dp=2 x tp=2, with
//     sequence parallelism, pp=2 whose tied wte counts once);
//   * end_backward() sums the sequence-parallel partial gradients over the stage's ranks and the
//     tied wte over the embedding group (before it each rank holds its part, after it the sum);
//   * gather() on world rank 0 returns every tensor of the one-rank model under its global name,
//     with its values after initialize(seed) (tensor-parallel shards, pipeline stages, ZeRO-3
//     shards, expert-parallel experts), and every optimizer-state tensor;
//   * traffic() counts a step's data-parallel bytes as the ring formula does, the pipeline's
//     messages, and starts again from zero at begin_step();
//   * hybrid sharding (HSDP: ZeRO shards over 2 of dp=4 ranks, replicated twice) gives the
//     one-rank norm and model, and its bytes are the shard group's reduce-scatter plus the
//     replicas' all-reduce of a shard.
#include "tessera/parallel/rank_engines.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/nn/gpt.h"
#include "tessera/optim/adamw.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/parallel/pipeline/step_executor.h"
#include "tp_layer_fixture.h"

namespace tessera::parallel {
namespace {

constexpr int kSeq = 8, kBatch = 4, kVocab = 64;
constexpr uint64_t kSeed = 7;

nn::GPTConfig config(bool moe) {
  nn::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = kSeq;
  c.vocab_size = kVocab;
  if (moe) c.moe.experts = 4;
  return c;
}

// Samples [first, first + B) of the step's global batch; targets are the next tokens.
struct Tokens {
  std::vector<int32_t> in, tgt;
  int64_t first = 0;
  int B = 0;
  nn::Batch batch() const { return nn::Batch{in.data(), tgt.data(), B, kSeq, first}; }
};

Tokens tokens(int64_t first, int B) {
  Tokens t;
  t.first = first;
  t.B = B;
  auto token = [](int64_t sample, int pos) {
    return static_cast<int32_t>((sample * 13 + pos * 7 + (sample * pos) % 5) % kVocab);
  };
  for (int64_t s = first; s < first + B; ++s)
    for (int pos = 0; pos < kSeq; ++pos) {
      t.in.push_back(token(s, pos));
      t.tgt.push_back(token(s, pos + 1));
    }
  return t;
}

const nn::StepContext kCtx{3, 0, true, 1.0f / (kBatch * kSeq)};

OptimizerFactory adamw(Allocator& alloc) {
  return [&alloc](std::vector<optim::Segment> s, int64_t n) {
    return std::make_unique<optim::AdamW>(std::move(s), n, optim::AdamWConfig{}, alloc);
  };
}

// ---- one rank
// ------------------------------------------------------------------------------------

struct OneRank {
  double norm = 0;
  nn::Globals grads, weights;
  std::map<std::string, int64_t> optimizer_state;  // name -> elements
};

// The whole model on one rank: initialize(kSeed), then one forward and backward of the global
// batch.
const OneRank& one_rank(bool moe) {
  static std::map<bool, OneRank> refs;
  auto it = refs.find(moe);
  if (it != refs.end()) return it->second;
  Allocator alloc("one rank");
  CurrentAllocatorScope scope(alloc);
  nn::GPT model(config(moe), kBatch, alloc);
  model.initialize(kSeed);
  OneRank r;
  for (nn::ParameterSet* ps : {&model.params(), &model.expert_params()}) {
    for (auto& [name, v] : nn::expand(*ps, false)) r.weights[name] = std::move(v);
    optim::AdamW opt(*ps, optim::AdamWConfig{}, alloc);
    for (const auto& [name, t] : opt.state(*ps)) r.optimizer_state[name] = t.numel();
  }
  const Tokens data = tokens(0, kBatch);
  model.forward(kCtx, data.batch(), model.shared_record());
  model.backward(model.shared_record(), nullptr, nn::BackwardPass{});
  double sum = 0;
  for (nn::ParameterSet* ps : {&model.params(), &model.expert_params()})
    for (auto& [name, g] : nn::expand(*ps, true)) {
      for (float x : g) sum += static_cast<double>(x) * x;
      r.grads[name] = std::move(g);
    }
  r.norm = std::sqrt(sum);
  return refs.emplace(moe, std::move(r)).first->second;
}

// ---- a rank of a layout
// ----------------------------------------------------------------------------

struct Layout {
  int dp = 1, pp = 1, tp = 1, ep = 1, zero = 0;
  bool sp = false, moe = false;
  int micro_batches = 1;  // per rank and step
  int zero_shard = 0;     // HSDP: ranks per ZeRO shard group (0: all of dp)
  int world() const { return dp * pp * tp; }
};

std::string layout_name(const Layout& l) {
  std::string s = "dp" + std::to_string(l.dp);
  if (l.pp > 1) s += "_pp" + std::to_string(l.pp);
  if (l.tp > 1) s += "_tp" + std::to_string(l.tp);
  if (l.ep > 1) s += "_ep" + std::to_string(l.ep);
  if (l.sp) s += "_sp";
  if (l.moe) s += "_moe";
  s += "_zero" + std::to_string(l.zero);
  if (l.zero_shard > 0) s += "_shard" + std::to_string(l.zero_shard);
  if (l.micro_batches > 1) s += "_micro" + std::to_string(l.micro_batches);
  return s;
}

void PrintTo(const Layout& l, std::ostream* os) {
  *os << layout_name(l);
}

// One world rank: its mesh, its stage of the model (pp=2: units 0-1 and 2-3), its engines
// (initialised with kSeed).
struct Rank {
  Layout l;
  Mesh mesh;
  DataParallelOptions o;
  int micro;
  nn::GPT model;
  RankEngines engines;

  static nn::GPTLayout stage_layout(const Layout& l, const Mesh& mesh,
                                    const DataParallelOptions& o) {
    nn::GPTLayout base;
    base.sequence_parallel = l.sp;
    if (l.pp == 2) {
      base.first_unit = mesh.pp_rank() == 0 ? 0 : 2;
      base.last_unit = mesh.pp_rank() == 0 ? 1 : -1;
    }
    return gpt_layout_for(o, mesh.shape().shard_size(), base, l.dp / l.ep);
  }

  Rank(comm::Communicator& world, const Layout& layout, Allocator& alloc)
      : l(layout),
        mesh(world, MeshShape{l.dp, l.pp, l.tp, l.ep, 1, l.zero_shard}),
        o{zero_stage(l.zero), /*bucket_mb=*/0.01, /*overlap=*/true},
        micro(kBatch / l.dp / l.micro_batches),
        model(config(l.moe), micro, alloc, stage_layout(l, mesh, o), mesh.tp(), mesh.ep()),
        engines({&model}, mesh, o, alloc, adamw(alloc)) {
    engines.initialize(kSeed);
  }

  // One step's forward and backward of this rank's share of the global batch, through the
  // executor (one stage: gradient accumulation; pp=2: 1F1B), then end_backward() and grad_norm().
  // around_reduce(false) runs just before end_backward(), around_reduce(true) just after.
  double step(const std::function<void(bool)>& around_reduce = {}) {
    const Schedule s = l.pp == 1 ? single_stage_schedule(l.micro_batches)
                                 : make_schedule(ScheduleKind::OneFOneB, l.pp, l.micro_batches);
    StepExecutor exec({&model}, mesh.pp());
    engines.begin_step();
    Tokens data;
    double norm = NAN;
    StepCallbacks cb;
    cb.fetch = [&](int m) {
      data = tokens(int64_t{mesh.dp_rank()} * (kBatch / l.dp) + m * micro, micro);
      return data.batch();
    };
    cb.reduce_gradients = [&] {
      if (around_reduce) around_reduce(false);
      engines.end_backward();
      if (around_reduce) around_reduce(true);
    };
    cb.optimizer_step = [&](double) { norm = engines.grad_norm(); };
    exec.run(s, kCtx, cb, model.hidden_elems(micro, kSeq));
    return norm;
  }
};

// Runs body(rank) on every world rank of the layout.
void on_ranks(const Layout& l, const std::function<void(Rank&)>& body) {
  comm::run_inproc(l.world(), [&](comm::Communicator& world) {
    Allocator alloc("rank " + std::to_string(world.rank()));
    CurrentAllocatorScope scope(alloc);
    Rank r(world, l, alloc);
    body(r);
  });
}

// ---- the tests
// -------------------------------------------------------------------------------------

class RankEnginesNorm : public ::testing::TestWithParam<Layout> {};

TEST_P(RankEnginesNorm, IsTheOneRankNormOnEveryRank) {
  const Layout l = GetParam();
  std::vector<double> norms(static_cast<size_t>(l.world()));
  on_ranks(l, [&](Rank& r) { norms[static_cast<size_t>(r.mesh.rank())] = r.step(); });
  const double want = one_rank(false).norm;
  ASSERT_GT(want, 0);
  for (size_t i = 0; i < norms.size(); ++i) {
    EXPECT_EQ(norms[i], norms[0]) << "world rank " << i;  // one reduction over the world
    EXPECT_NEAR(norms[i], want, 1e-6 * want) << "world rank " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RankEnginesNorm,
    ::testing::Values(
        Layout{.dp = 2, .zero = 0}, Layout{.dp = 2, .zero = 3},
        Layout{.dp = 2, .zero = 3, .micro_batches = 2}, Layout{.dp = 2, .tp = 2, .zero = 0},
        Layout{.dp = 2, .tp = 2, .zero = 1, .sp = true}, Layout{.pp = 2, .micro_batches = 2},
        Layout{.dp = 2, .pp = 2, .zero = 2, .micro_batches = 2},
        Layout{.dp = 4, .zero = 1, .zero_shard = 2}, Layout{.dp = 4, .zero = 3, .zero_shard = 2},
        Layout{.dp = 4, .zero = 2, .micro_batches = 1, .zero_shard = 1},
        Layout{.dp = 2, .tp = 2, .zero = 3, .sp = true, .zero_shard = 1}),
    [](const auto& info) { return layout_name(info.param); });

// tp=2 with --sp: each rank's LayerNorm gradients see half of the tokens until end_backward sums
// them over the stage's ranks (both then hold the sum, exactly); nothing else changes there.
TEST(RankEngines, SumsSequenceParallelPartialGradientsInEndBackward) {
  const Layout l{.tp = 2, .sp = true};
  std::vector<nn::Globals> before(2), after(2);
  std::vector<std::set<std::string>> marked(2);
  on_ranks(l, [&](Rank& r) {
    const size_t t = static_cast<size_t>(r.mesh.tp_rank());
    const nn::ParameterSet& ps = r.model.params();
    for (const nn::ParamInfo& info : ps.infos())
      if (info.reduction.over_tensor_parallel) marked[t].insert(info.name);
    r.step([&](bool done) { (done ? after : before)[t] = nn::expand(ps, true); });
  });
  ASSERT_EQ(marked[0], marked[1]);
  // ln_1 and ln_2 of each block and ln_f, weight and bias.
  EXPECT_EQ(marked[0].size(), 10u);
  const nn::Globals& want = one_rank(false).grads;
  for (const auto& [name, g] : before[0]) {
    SCOPED_TRACE(name);
    if (!marked[0].contains(name)) {  // summed nowhere (dp=1): unchanged
      for (size_t t = 0; t < 2; ++t)
        EXPECT_EQ(0, std::memcmp(before[t].at(name).data(), after[t].at(name).data(),
                                 sizeof(float) * g.size()));
      continue;
    }
    double differs = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const float sum = before[0].at(name)[i] + before[1].at(name)[i];
      ASSERT_EQ(after[0].at(name)[i], sum) << i;
      ASSERT_EQ(after[1].at(name)[i], sum) << i;
      differs = std::max(differs, static_cast<double>(std::abs(before[0].at(name)[i] - sum)));
    }
    EXPECT_GT(differs, 1e-3 * nn::max_abs(want.at(name)));  // a part, not the whole
    nn::expect_near_all(want.at(name), after[0].at(name), 1e-5, name);
  }
  // Every gradient (each rank's shards of the split ones) is the one-rank gradient.
  nn::expect_shards_match(want, after, 1e-5, "gradient");
}

// pp=2: the first stage's wte (the embedding's) and the last stage's copy (the head's) each hold
// their part of the gradient until end_backward sums them over the embedding group; then both
// hold the same bits, the one-rank gradient of wte.
TEST(RankEngines, SumsTheTiedEmbeddingOverTheEmbeddingGroupInEndBackward) {
  const Layout l{.pp = 2, .micro_batches = 2};
  std::vector<std::vector<float>> before(2), after(2);
  std::vector<nn::Globals> grads(2);
  on_ranks(l, [&](Rank& r) {
    const size_t p = static_cast<size_t>(r.mesh.pp_rank());
    const nn::ParameterSet& ps = r.model.params();
    r.step([&](bool done) {
      (done ? after : before)[p] = ps.grad("wte.weight").to_vector();
      if (done) grads[p] = nn::expand(ps, true);
    });
  });
  const std::vector<float>& want = one_rank(false).grads.at("wte.weight");
  ASSERT_EQ(after[0].size(), want.size());
  ASSERT_EQ(after[1].size(), want.size());
  EXPECT_EQ(0, std::memcmp(after[0].data(), after[1].data(), sizeof(float) * want.size()));
  double differs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(after[0][i], before[0][i] + before[1][i]) << i;
    differs = std::max(differs, static_cast<double>(std::abs(before[0][i] - before[1][i])));
  }
  EXPECT_GT(differs, 1e-3 * nn::max_abs(want));
  nn::expect_near_all(want, after[0], 1e-5, "wte.weight");
  // The stages' other gradients are the one-rank ones too, and between them they hold them all.
  std::set<std::string> names;
  for (const nn::Globals& stage : grads)
    for (const auto& [name, g] : stage) {
      names.insert(name);
      nn::expect_near_all(one_rank(false).grads.at(name), g, 1e-5, name);
    }
  EXPECT_EQ(names.size(), one_rank(false).grads.size());
}

class RankEnginesGather : public ::testing::TestWithParam<Layout> {};

// After initialize(seed), world rank 0 gathers exactly the one-rank model's tensors (each once,
// bitwise), and an optimizer-state tensor of each kind for each of them.
TEST_P(RankEnginesGather, GivesWorldRankZeroTheOneRankModel) {
  const Layout l = GetParam();
  std::vector<std::pair<std::string, std::vector<float>>> weights;  // world rank 0's, in order
  std::map<std::string, int64_t> state;
  on_ranks(l, [&](Rank& r) {
    const RankEngines::Gathered g = r.engines.gather();  // collective
    if (r.mesh.rank() != 0) return;
    for (const auto& [name, t] : g.weights) weights.emplace_back(name, t.to_vector());
    for (const auto& [name, t] : g.optimizer_state) state[name] = t.numel();
  });
  const OneRank& want = one_rank(l.moe);
  std::set<std::string> seen;
  for (const auto& [name, w] : weights) {
    EXPECT_TRUE(seen.insert(name).second) << name << " twice";
    ASSERT_TRUE(want.weights.contains(name)) << name;
    ASSERT_EQ(w.size(), want.weights.at(name).size()) << name;
    EXPECT_EQ(0, std::memcmp(w.data(), want.weights.at(name).data(), sizeof(float) * w.size()))
        << name;
  }
  EXPECT_EQ(seen.size(), want.weights.size());
  EXPECT_EQ(seen.contains("h.1.mlp.experts.3.c_proj.weight"), l.moe);
  EXPECT_EQ(state, want.optimizer_state);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RankEnginesGather,
    ::testing::Values(Layout{.tp = 2}, Layout{.pp = 2}, Layout{.dp = 2, .tp = 2, .zero = 3},
                      Layout{.dp = 2, .ep = 2, .moe = true},
                      Layout{.dp = 2, .ep = 2, .zero = 1, .moe = true},
                      Layout{.dp = 4, .zero = 3, .zero_shard = 2},
                      Layout{.dp = 4, .ep = 2, .zero = 3, .moe = true, .zero_shard = 2}),
    [](const auto& info) { return layout_name(info.param); });

// dp=2 at ZeRO 0: a step all-reduces the whole (padded) gradient buffer once, 2 (n-1)/n of its
// bytes per rank; pp=2: each stage sends one message per micro-batch, and the embedding group
// all-reduces wte. begin_step() zeroes the counters.
TEST(RankEngines, TrafficCountsTheStepsBytes) {
  on_ranks(Layout{.dp = 2, .zero = 0}, [](Rank& r) {
    const double grads = 4.0 * static_cast<double>(r.model.params().numel());
    for (int step = 0; step < 2; ++step) {  // counted per step, not summed over steps
      r.step();
      const StepTraffic t = r.engines.traffic();
      EXPECT_EQ(t.data_parallel, 2.0 * (2 - 1) / 2 * grads);
      EXPECT_EQ(t.tensor_parallel, 0.0);
      EXPECT_EQ(t.pipeline, 0.0);
      EXPECT_EQ(t.expert_parallel, 0.0);
    }
    r.engines.begin_step();
    EXPECT_EQ(r.engines.traffic().data_parallel, 0.0);
  });
  on_ranks(Layout{.pp = 2, .micro_batches = 2}, [](Rank& r) {
    r.step();
    const StepTraffic t = r.engines.traffic();
    const double wte = 4.0 * kVocab * 32;
    EXPECT_EQ(t.data_parallel, 2.0 * (2 - 1) / 2 * wte);
    EXPECT_EQ(t.pipeline, 4.0 * 2 * static_cast<double>(r.model.hidden_elems(r.micro, kSeq)));
    EXPECT_EQ(t.tensor_parallel, 0.0);
    r.engines.begin_step();
    EXPECT_EQ(r.engines.traffic().pipeline, 0.0);
    EXPECT_EQ(r.engines.traffic().data_parallel, 0.0);
  });
}

// HSDP at dp=4, ZeRO 2, shard groups of 2: a step reduce-scatters the gradients inside the shard
// group, (2-1)/2 of the buffer, and all-reduces each rank's half over its 2 replicas, 2 (2-1)/2
// of a half; plain ZeRO 2 reduce-scatters over all 4 ranks, 3/4 of the buffer.
TEST(RankEngines, HybridShardingSendsAShardGroupReduceScatterAndAReplicaAllReduce) {
  on_ranks(Layout{.dp = 4, .zero = 2, .zero_shard = 2}, [](Rank& r) {
    ASSERT_NE(r.mesh.zero_replica_group(), nullptr);
    EXPECT_EQ(r.mesh.zero_shard_group().size(), 2);
    EXPECT_EQ(r.mesh.zero_replica_group()->size(), 2);
    // Shard groups are consecutive dp ranks, replicas the same position in each.
    EXPECT_EQ(r.mesh.zero_shard_group().rank(), r.mesh.dp_rank() % 2);
    EXPECT_EQ(r.mesh.zero_replica_group()->rank(), r.mesh.dp_rank() / 2);
    const double grads = 4.0 * static_cast<double>(r.model.params().numel());
    r.step();
    const StepTraffic t = r.engines.traffic();
    EXPECT_EQ(t.zero_replicas, 2.0 * (2 - 1) / 2 * (grads / 2));
    EXPECT_EQ(t.data_parallel, (2.0 - 1) / 2 * grads + t.zero_replicas);
  });
  on_ranks(Layout{.dp = 4, .zero = 2}, [](Rank& r) {
    EXPECT_EQ(r.mesh.zero_replica_group(), nullptr);
    const double grads = 4.0 * static_cast<double>(r.model.params().numel());
    r.step();
    EXPECT_EQ(r.engines.traffic().zero_replicas, 0.0);
    EXPECT_EQ(r.engines.traffic().data_parallel, (4.0 - 1) / 4 * grads);
  });
}

TEST(RankEngines, HybridShardingRefusesZeroZeroAndAShardGroupThatDoesNotDivide) {
  EXPECT_THROW(validate_mesh(MeshShape{4, 1, 1, 1, 1, 3}, 4), ConfigError);
  try {
    on_ranks(Layout{.dp = 4, .zero = 0, .zero_shard = 2}, [](Rank&) {});
    FAIL() << "ZeRO 0 with a shard group was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs zero 1, 2 or 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::parallel
