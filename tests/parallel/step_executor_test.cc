// The pipeline step executor (parallel/pipeline/step_executor.h) on its own, on a toy
// nn::StageModel (a chain of elementwise units over 3 floats per token) split into the stages of
// every schedule on pp thread ranks, against the same toy unsplit on one rank:
//   * the losses, every unit's inputs, outputs and gradients, and the parameter gradients are
//     bitwise the one-rank ones (each stage sums its micro-batches in the same order);
//   * the backward (B, or W after BI) is told last_micro_batch only in the step's last micro-batch;
//   * each chunk allocates exactly the records the schedule holds in flight (count_in_flight, and
//     simulate's peak), and a second step allocates none;
//   * fetch is called once per forward (with that forward's micro-batch, in the rank's order),
//     reduce_gradients once after every backward, optimizer_step once after it with the last
//     stage's loss sum (0 elsewhere);
//   * an input gradient leaves its record (input_grad is read for the send) before the record
//     takes another micro-batch, and the gradients that arrive are the ones sent;
//   * with a bf16 wire the activations and gradients that arrive are the bf16 roundings of those
//     sent.
#include "tessera/parallel/pipeline/step_executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/dtype.h"
#include "tessera/nn/stage_model.h"
#include "tessera/parallel/pipeline/schedule_deadlock.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/parallel/pipeline/schedule_simulate.h"
#include "tessera/parallel/pipeline/schedule_validate.h"

namespace tessera::parallel {
namespace {

constexpr int kUnits = 8;  // 0: embedding, 1..6: layers, 7: head
constexpr int kWidth = 3;  // floats per token
constexpr int kB = 2, kT = 3, kRows = kB * kT;
constexpr int kVocab = 11;
constexpr uint64_t kSeed = 5;

// ---- the toy model ------------------------------------------------------------------------------

// Unit 0 (embedding):  x[r, h] = scale[h] t_r + shift[h], t_r = 0.1 (token_r + 1)
// Units 1..6 (layers): y[r, h] = tanh(w[h] x[r, h] + b[h])
// Unit 7 (head):       loss = sum_r 0.5 (sum_h v[h] x[r, h] - 0.1 target_r)^2
// BI computes input gradients and the biases' and embedding's gradients, keeping each layer's
// pre-activation gradient (the head's: the prediction's) for W, which accumulates w's (v's).

void embed_forward(const float* scale, const float* shift, const float* tok, float* y) {
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < kWidth; ++h) y[r * kWidth + h] = scale[h] * tok[r] + shift[h];
}
void embed_grads(const float* dy, const float* tok, float* dscale, float* dshift) {
  for (int h = 0; h < kWidth; ++h) {
    float s = 0, t = 0;
    for (int r = 0; r < kRows; ++r) s += dy[r * kWidth + h] * tok[r], t += dy[r * kWidth + h];
    dscale[h] += s;
    dshift[h] += t;
  }
}
void layer_forward(const float* w, const float* b, const float* x, float* y) {
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < kWidth; ++h) y[r * kWidth + h] = std::tanh(w[h] * x[r * kWidth + h] + b[h]);
}
// d: dL/dy in, dL/dx out; dz: dL/d pre-activation (kept for W).
void layer_input_grad(const float* w, const float* y, float* d, float* dz, float* db) {
  for (int i = 0; i < kRows * kWidth; ++i) dz[i] = d[i] * (1.0f - y[i] * y[i]);
  for (int h = 0; h < kWidth; ++h) {
    float s = 0;
    for (int r = 0; r < kRows; ++r) s += dz[r * kWidth + h];
    db[h] += s;
  }
  for (int i = 0; i < kRows * kWidth; ++i) d[i] = dz[i] * w[i % kWidth];
}
// dw += sum over rows of g[r] (per element, or per row when per_row) x[r, h].
void weight_grad(const float* g, bool per_row, const float* x, float* dw) {
  for (int h = 0; h < kWidth; ++h) {
    float s = 0;
    for (int r = 0; r < kRows; ++r) s += g[per_row ? r : r * kWidth + h] * x[r * kWidth + h];
    dw[h] += s;
  }
}

// What a toy stage saw during a step, by global unit and micro-batch.
struct ToyLog {
  using ByMicroBatch = std::map<int, std::vector<float>>;
  std::map<int, ByMicroBatch> in, out, dout, din;  // a unit's input, output and their gradients
  std::vector<std::pair<int, bool>> passes;        // each B or W: micro-batch, last_micro_batch
  int backward_inputs = 0;
  std::vector<std::string> problems;  // the record contract broken (see ToyStage::Record)
  void clear() { *this = ToyLog(); }
};

class ToyStage final : public nn::StageModel {
 public:
  // A record's life: Free -> [input() for the receive: Filled] -> forward: Forwarded -> B: Free
  // (or BI: InputGradient -> W: Free). After the backward of a stage with an input, input_grad()
  // must be read (the send) before the record takes another micro-batch: the gradient lives in the
  // input's buffer, which the next receive overwrites.
  enum class State { Free, Filled, Forwarded, InputGradient };
  struct Record final : nn::StageRecord {
    std::vector<float> input;              // the stage's input; dL/d input after the backward
    std::vector<std::vector<float>> acts;  // acts[0]: the input as read; acts[k + 1]: unit k's out
    std::vector<std::vector<float>> kept;  // per unit, from BI for W
    std::vector<float> tok, err;           // the tokens as floats; the head's prediction errors
    float loss_scale = 0;
    int micro_batch = -1;
    State state = State::Free;
    mutable bool gradient_sent = true;
  };

  ToyStage(int first_unit, int last_unit, Allocator& alloc)
      : first_(first_unit), last_(last_unit), dres_(kRows * kWidth) {
    unit_begin_.push_back(0);
    for (int u = first_; u <= last_; ++u) {
      std::vector<int> idx;
      auto add = [&](const std::string& name, float init_std) {
        idx.push_back(ps_.add(name, {kWidth}, nn::Init::Normal, init_std, false));
      };
      if (u == 0) {
        add("embed.scale", 0.5f), add("embed.shift", 0.5f);
      } else if (u == kUnits - 1) {
        add("head.v", 0.5f);
      } else {
        add("layer" + std::to_string(u) + ".w", 0.3f);
        add("layer" + std::to_string(u) + ".b", 0.2f);
      }
      param_.push_back(idx);
      ps_.pad_to_multiple(16);
      unit_begin_.push_back(ps_.numel());
    }
    ps_.materialize(alloc, nn::FlatLayout{});
  }

  // Layout-invariant values (decision 3), the layers' gains around 1.
  void initialize(uint64_t seed) {
    ps_.initialize(seed);
    for (int i = 0; i < ps_.size(); ++i)
      if (ps_.infos()[i].name.ends_with(".w"))
        for (int h = 0; h < kWidth; ++h) ps_.param_data(i)[h] += 1.0f;
  }
  ToyLog& log() { return log_; }
  const ToyLog& log() const { return log_; }
  std::set<const nn::StageRecord*> records_used() const { return records_; }

  // nn::UnitModel
  nn::ParameterSet& params() override { return ps_; }
  const nn::ParameterSet& params() const override { return ps_; }
  int first_unit() const override { return first_; }
  int last_unit() const override { return last_; }
  int64_t unit_begin(int u) const override { return unit_begin_[static_cast<size_t>(u - first_)]; }
  bool holds_whole_model() const override { return first_ == 0 && last_ == kUnits - 1; }
  void add_hooks(nn::UnitHooks* h) override { hooks_.add(h); }
  void remove_hooks(nn::UnitHooks* h) override { hooks_.remove(h); }

  // nn::StageModel
  std::unique_ptr<nn::StageRecord> make_record() override {
    auto rec = std::make_unique<Record>();
    const size_t n = kRows * kWidth;
    rec->input.assign(n, 0.0f);
    rec->acts.assign(static_cast<size_t>(units()) + 1, std::vector<float>(n));
    rec->kept.assign(static_cast<size_t>(units()), std::vector<float>(n));
    rec->tok.assign(kRows, 0.0f);
    rec->err.assign(kRows, 0.0f);
    return rec;
  }

  double forward(const nn::StepContext& ctx, const nn::Batch& b, nn::StageRecord& r) override {
    Record& rec = record(r);
    records_.insert(&rec);
    const State want = first_ == 0 ? State::Free : State::Filled;
    if (rec.state != want) problem("forward on a record that was not ready", rec);
    if (!rec.gradient_sent) problem("forward before the record's input gradient was sent", rec);
    if (b.B != kB || b.T != kT) problem("a batch of another shape", rec);
    rec.micro_batch = static_cast<int>(b.first_sample / kB);
    rec.loss_scale = ctx.loss_scale;
    rec.state = State::Forwarded;
    const int m = rec.micro_batch;
    if (first_ > 0) rec.acts[0] = rec.input;
    double loss = 0;
    for (int k = 0; k < units(); ++k) {
      const int u = first_ + k;
      const float* x = rec.acts[static_cast<size_t>(k)].data();
      float* y = rec.acts[static_cast<size_t>(k) + 1].data();
      hooks_.forward(u, [&] {
        if (u == 0) {
          for (int i = 0; i < kRows; ++i) rec.tok[i] = 0.1f * static_cast<float>(b.tokens[i] + 1);
          embed_forward(w(u, 0), w(u, 1), rec.tok.data(), y);
        } else if (u == kUnits - 1) {
          for (int i = 0; i < kRows; ++i) {
            float pred = 0;
            for (int h = 0; h < kWidth; ++h) pred += w(u, 0)[h] * x[i * kWidth + h];
            rec.err[i] = pred - 0.1f * static_cast<float>(b.targets[i]);
            loss += 0.5 * static_cast<double>(rec.err[i]) * rec.err[i];
          }
        } else {
          layer_forward(w(u, 0), w(u, 1), x, y);
        }
      });
      if (u > 0) log_.in[u][m].assign(x, x + kRows * kWidth);
      if (u < kUnits - 1) log_.out[u][m].assign(y, y + kRows * kWidth);
    }
    return loss;
  }

  void backward(nn::StageRecord& r, const float* dout, const nn::BackwardPass& pass) override {
    backward_pass(record(r), dout, false, pass);
  }
  void backward_input(nn::StageRecord& r, const float* dout) override {
    ++log_.backward_inputs;
    backward_pass(record(r), dout, true, {});
  }
  void backward_weight(nn::StageRecord& r, const nn::BackwardPass& pass) override {
    Record& rec = record(r);
    if (rec.state != State::InputGradient) problem("W without its BI", rec);
    for (int k = units() - 1; k >= 0; --k) {
      const int u = first_ + k;
      hooks_.call(&nn::UnitHooks::before_backward_weight, u);
      weight_part(rec, k);
      hooks_.after_backward(u, pass);
    }
    rec.state = State::Free;
    log_.passes.emplace_back(rec.micro_batch, pass.last_micro_batch);
  }

  float* input(nn::StageRecord& r) override {
    Record& rec = record(r);
    if (first_ == 0) problem("input() of the first stage", rec);
    if (rec.state != State::Free) problem("a receive into a record in flight", rec);
    if (!rec.gradient_sent) problem("a receive over an input gradient not yet sent", rec);
    rec.state = State::Filled;
    return rec.input.data();
  }
  const float* output(const nn::StageRecord& r) const override {
    return record(r).acts.back().data();
  }
  const float* input_grad(const nn::StageRecord& r) const override {
    const Record& rec = record(r);
    rec.gradient_sent = true;
    return rec.input.data();
  }
  int64_t hidden_elems(int B, int T) const override { return int64_t{B} * T * kWidth; }

 private:
  static Record& record(nn::StageRecord& r) { return static_cast<Record&>(r); }
  static const Record& record(const nn::StageRecord& r) { return static_cast<const Record&>(r); }
  int units() const { return last_ - first_ + 1; }
  float* w(int u, int j) const {
    return ps_.param_data(param_[static_cast<size_t>(u - first_)][j]);
  }
  float* g(int u, int j) const { return ps_.grad_data(param_[static_cast<size_t>(u - first_)][j]); }
  void problem(const std::string& what, const Record& rec) {
    log_.problems.push_back(what + " (micro-batch " + std::to_string(rec.micro_batch) + ")");
  }

  void backward_pass(Record& rec, const float* dout, bool split, const nn::BackwardPass& pass) {
    if (rec.state != State::Forwarded) problem("a backward without its forward", rec);
    const int m = rec.micro_batch;
    float* d = dres_.data();
    const int n = kRows * kWidth;
    if (last_ < kUnits - 1) {
      if (dout == nullptr) problem("no output gradient", rec);
      if (dout != nullptr) std::copy(dout, dout + n, d);
    }
    for (int k = units() - 1; k >= 0; --k) {
      const int u = first_ + k;
      hooks_.call(&nn::UnitHooks::before_backward, u);
      if (u < kUnits - 1) log_.dout[u][m].assign(d, d + n);
      float* kept = rec.kept[static_cast<size_t>(k)].data();
      if (u == 0) {
        embed_grads(d, rec.tok.data(), g(u, 0), g(u, 1));  // all cheap: now, as GPT's embedding
      } else if (u == kUnits - 1) {
        for (int i = 0; i < kRows; ++i) kept[i] = rec.loss_scale * rec.err[i];
        for (int i = 0; i < n; ++i) d[i] = kept[i / kWidth] * w(u, 0)[i % kWidth];
      } else {
        layer_input_grad(w(u, 0), rec.acts[static_cast<size_t>(k) + 1].data(), d, kept, g(u, 1));
      }
      if (u > 0) log_.din[u][m].assign(d, d + n);
      if (split) {
        hooks_.call_reverse(&nn::UnitHooks::after_backward_input, u);
      } else {
        weight_part(rec, k);
        hooks_.after_backward(u, pass);
      }
    }
    if (first_ > 0) {  // dL/d input, in the input's buffer
      std::copy(d, d + n, rec.input.begin());
      rec.gradient_sent = false;
    }
    rec.state = split ? State::InputGradient : State::Free;
    if (!split) log_.passes.emplace_back(m, pass.last_micro_batch);
  }

  void weight_part(const Record& rec, int k) {
    const int u = first_ + k;
    if (u == 0) return;
    weight_grad(rec.kept[static_cast<size_t>(k)].data(), u == kUnits - 1,
                rec.acts[static_cast<size_t>(k)].data(), g(u, 0));
  }

  int first_, last_;
  nn::ParameterSet ps_;
  std::vector<std::vector<int>> param_;  // per unit, its parameters' indices
  std::vector<int64_t> unit_begin_;
  nn::UnitHookList hooks_;
  std::vector<float> dres_;  // the gradient flowing down the stage (scratch)
  ToyLog log_;
  std::set<const nn::StageRecord*> records_;
};

// ---- data, the reference and the pipeline run ---------------------------------------------------

struct Data {
  std::vector<std::vector<int32_t>> tokens, targets;  // per micro-batch, [kRows]
  explicit Data(int micro_batches) {
    for (int m = 0; m < micro_batches; ++m) {
      tokens.emplace_back(), targets.emplace_back();
      for (int r = 0; r < kRows; ++r) {
        tokens.back().push_back((7 * m + 3 * r + 1) % kVocab);
        targets.back().push_back((5 * m + 2 * r + 4) % kVocab);
      }
    }
  }
  nn::Batch batch(int m) const {
    return nn::Batch{tokens[static_cast<size_t>(m)].data(), targets[static_cast<size_t>(m)].data(),
                     kB, kT, int64_t{m} * kB};
  }
};

nn::StepContext step_context(int micro_batches, int step) {
  return nn::StepContext{1, static_cast<uint64_t>(step), true, 1.0f / (micro_batches * kRows)};
}

using Grads = std::map<std::string, std::vector<float>>;

Grads grads_of(const nn::ParameterSet& ps) {
  Grads out;
  for (int i = 0; i < ps.size(); ++i) out[ps.infos()[i].name] = ps.grad(i).to_vector();
  return out;
}

// The toy unsplit on one rank, its micro-batches one after the other (gradient accumulation).
struct Reference {
  double loss = 0;
  Grads grads;
  ToyLog log;
};

const Reference& reference(int micro_batches) {
  static std::map<int, Reference> refs;
  auto it = refs.find(micro_batches);
  if (it != refs.end()) return it->second;
  Allocator alloc("reference");
  CurrentAllocatorScope scope(alloc);
  ToyStage model(0, kUnits - 1, alloc);
  model.initialize(kSeed);
  const Data data(micro_batches);
  const nn::StepContext ctx = step_context(micro_batches, 0);
  std::unique_ptr<nn::StageRecord> rec = model.make_record();
  Reference r;
  for (int m = 0; m < micro_batches; ++m) {
    r.loss += model.forward(ctx, data.batch(m), *rec);
    model.backward(*rec, nullptr, nn::BackwardPass{m == micro_batches - 1});
  }
  r.grads = grads_of(model.params());
  r.log = model.log();
  EXPECT_TRUE(r.log.problems.empty());
  return refs.emplace(micro_batches, std::move(r)).first->second;
}

// The units of model stage s of n: an even contiguous split of the kUnits.
std::pair<int, int> units_of(int stage, int stages) {
  return {stage * kUnits / stages, (stage + 1) * kUnits / stages - 1};
}

struct RankStep {  // what one rank's callbacks saw in one step
  std::vector<int> fetched;
  int reduces = 0, optimizer_steps = 0;
  bool backwards_done_at_reduce = false;  // every chunk had run all of its B (or W)
  bool reduced_before_step = false;
  double step_loss = NAN, returned = NAN;
  std::vector<int> records;  // per chunk, after the step
  StepTiming timing;
};

struct StageRun {
  int rank = 0, chunk = 0, first_unit = 0, last_unit = 0;
  ToyLog log;                // of the last step
  std::vector<Grads> grads;  // per step
  int distinct_records = 0;
};

struct PipelineRun {
  Schedule schedule;
  std::vector<std::vector<RankStep>> ranks;  // [rank][step]
  std::vector<StageRun> stages;              // by model stage
};

// Runs `steps` steps of `s` on its pp thread ranks (the gradients zeroed before each).
PipelineRun run_pipeline(const Schedule& s, DType wire, int steps = 2) {
  const int stages = s.num_model_stages(), M = s.micro_batches;
  PipelineRun run;
  run.schedule = s;
  run.ranks.assign(static_cast<size_t>(s.pp), {});
  run.stages.assign(static_cast<size_t>(stages), {});
  std::mutex mu;
  comm::run_inproc(s.pp, [&](comm::Communicator& world) {
    const int r = world.rank();
    Allocator alloc("rank " + std::to_string(r));
    CurrentAllocatorScope scope(alloc);
    std::vector<std::unique_ptr<ToyStage>> chunks;
    std::vector<nn::StageModel*> models;
    for (int c = 0; c < s.virtual_stages; ++c) {
      const auto [first, last] = units_of(s.stage_of(r, c), stages);
      chunks.push_back(std::make_unique<ToyStage>(first, last, alloc));
      chunks.back()->initialize(kSeed);
      models.push_back(chunks.back().get());
    }
    StepExecutor exec(models, world, wire);
    const Data data(M);
    std::vector<RankStep> rank_steps;
    std::vector<std::vector<Grads>> grads(chunks.size());
    for (int step = 0; step < steps; ++step) {
      for (auto& c : chunks) c->params().zero_grads(), c->log().clear();
      RankStep rs;
      StepCallbacks cb;
      cb.fetch = [&](int m) {
        rs.fetched.push_back(m);
        return data.batch(m);
      };
      cb.reduce_gradients = [&] {
        ++rs.reduces;
        rs.backwards_done_at_reduce = true;
        for (auto& c : chunks)
          rs.backwards_done_at_reduce &= static_cast<int>(c->log().passes.size()) == M;
      };
      cb.optimizer_step = [&](double loss_sum) {
        ++rs.optimizer_steps;
        rs.reduced_before_step = rs.reduces == 1;
        rs.step_loss = loss_sum;
      };
      rs.returned = exec.run(s, step_context(M, step), cb, kRows * kWidth);
      for (int c = 0; c < s.virtual_stages; ++c) {
        rs.records.push_back(exec.records_allocated(c));
        grads[static_cast<size_t>(c)].push_back(grads_of(chunks[static_cast<size_t>(c)]->params()));
      }
      rs.timing = exec.timing();
      rank_steps.push_back(std::move(rs));
    }
    std::lock_guard<std::mutex> lock(mu);
    run.ranks[static_cast<size_t>(r)] = std::move(rank_steps);
    for (int c = 0; c < s.virtual_stages; ++c) {
      const ToyStage& t = *chunks[static_cast<size_t>(c)];
      StageRun& out = run.stages[static_cast<size_t>(s.stage_of(r, c))];
      out.rank = r, out.chunk = c;
      out.first_unit = t.first_unit(), out.last_unit = t.last_unit();
      out.log = t.log();
      out.grads = std::move(grads[static_cast<size_t>(c)]);
      out.distinct_records = static_cast<int>(t.records_used().size());
    }
  });
  return run;
}

::testing::AssertionResult same_floats(const std::vector<float>& got,
                                       const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << "[" << i << "] = " << got[i] << ", want " << want[i];
  return ::testing::AssertionSuccess();
}

// Every entry of `want` (unit -> micro-batch -> values) that lies in [first, last] is in `got`.
void expect_same_log(const std::map<int, ToyLog::ByMicroBatch>& got,
                     const std::map<int, ToyLog::ByMicroBatch>& want, int first, int last,
                     const char* what) {
  for (int u = first; u <= last; ++u) {
    if (!want.contains(u)) {
      EXPECT_FALSE(got.contains(u)) << what << " of unit " << u;
      continue;
    }
    ASSERT_TRUE(got.contains(u)) << what << " of unit " << u;
    ASSERT_EQ(got.at(u).size(), want.at(u).size()) << what << " of unit " << u;
    for (const auto& [m, values] : want.at(u))
      EXPECT_TRUE(same_floats(got.at(u).at(m), values))
          << what << " of unit " << u << ", micro-batch " << m;
  }
}

// ---- the tests ----------------------------------------------------------------------------------

struct Case {
  ScheduleKind kind;
  int pp, micro_batches, virtual_stages;
};

std::string case_name(const Case& c) {
  std::string s = std::string(to_string(c.kind)) + "_pp" + std::to_string(c.pp) + "_m" +
                  std::to_string(c.micro_batches);
  if (c.virtual_stages > 1) s += "_v" + std::to_string(c.virtual_stages);
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

// One run per case (two steps, fp32 wire), shared by the tests below.
const PipelineRun& pipeline_run(const Case& c) {
  static std::map<std::string, PipelineRun> runs;
  const std::string key = case_name(c);
  auto it = runs.find(key);
  if (it == runs.end())
    it = runs.emplace(key,
                      run_pipeline(make_schedule(c.kind, c.pp, c.micro_batches, c.virtual_stages),
                                   DType::F32))
             .first;
  return it->second;
}

class StepExecutorSchedule : public ::testing::TestWithParam<Case> {};

TEST_P(StepExecutorSchedule, MatchesTheUnsplitModelBitwise) {
  const Case c = GetParam();
  const Reference& ref = reference(c.micro_batches);
  const PipelineRun& run = pipeline_run(c);
  const int last_rank = run.schedule.pp - 1;  // holds the last model stage in every schedule
  for (size_t r = 0; r < run.ranks.size(); ++r)
    for (const RankStep& rs : run.ranks[r]) {
      EXPECT_EQ(rs.step_loss, static_cast<int>(r) == last_rank ? ref.loss : 0.0) << "rank " << r;
      EXPECT_EQ(rs.returned, rs.step_loss) << "rank " << r;
    }
  Grads all;
  for (size_t s = 0; s < run.stages.size(); ++s) {
    const StageRun& st = run.stages[s];
    SCOPED_TRACE("stage " + std::to_string(s) + " (units " + std::to_string(st.first_unit) + ".." +
                 std::to_string(st.last_unit) + ")");
    EXPECT_TRUE(st.log.problems.empty()) << st.log.problems.front();
    expect_same_log(st.log.in, ref.log.in, st.first_unit, st.last_unit, "input");
    expect_same_log(st.log.out, ref.log.out, st.first_unit, st.last_unit, "output");
    expect_same_log(st.log.dout, ref.log.dout, st.first_unit, st.last_unit, "output gradient");
    expect_same_log(st.log.din, ref.log.din, st.first_unit, st.last_unit, "input gradient");
    ASSERT_EQ(st.grads.size(), 2u);
    for (size_t step = 0; step < st.grads.size(); ++step)
      for (const auto& [name, g] : st.grads[step]) {
        ASSERT_TRUE(ref.grads.contains(name)) << name;
        EXPECT_TRUE(same_floats(g, ref.grads.at(name))) << name << ", step " << step + 1;
        all[name] = g;
      }
  }
  EXPECT_EQ(all.size(), ref.grads.size());  // every parameter on exactly one stage
}

TEST_P(StepExecutorSchedule, TellsOnlyTheLastMicroBatchItIsLast) {
  const Case c = GetParam();
  const PipelineRun& run = pipeline_run(c);
  const bool split = traits(c.kind).splits_backward;
  for (size_t s = 0; s < run.stages.size(); ++s) {
    const ToyLog& log = run.stages[s].log;
    // One pass per micro-batch (B, or W after BI), in micro-batch order.
    ASSERT_EQ(static_cast<int>(log.passes.size()), c.micro_batches) << "stage " << s;
    for (int m = 0; m < c.micro_batches; ++m) {
      EXPECT_EQ(log.passes[static_cast<size_t>(m)].first, m) << "stage " << s;
      EXPECT_EQ(log.passes[static_cast<size_t>(m)].second, m == c.micro_batches - 1)
          << "stage " << s << ", micro-batch " << m;
    }
    EXPECT_EQ(log.backward_inputs, split ? c.micro_batches : 0) << "stage " << s;
  }
}

TEST_P(StepExecutorSchedule, AllocatesTheRecordsTheScheduleHoldsInFlight) {
  const Case c = GetParam();
  const PipelineRun& run = pipeline_run(c);
  const InFlight counted = count_in_flight(run.schedule);
  const Simulation sim = simulate(run.schedule);
  for (size_t s = 0; s < run.stages.size(); ++s) {
    const StageRun& st = run.stages[s];
    const int peak = counted.peak_in_flight[s];
    EXPECT_EQ(sim.peak_in_flight[s], peak) << "stage " << s;
    for (size_t step = 0; step < 2; ++step)  // the second step allocates none
      EXPECT_EQ(
          run.ranks[static_cast<size_t>(st.rank)][step].records[static_cast<size_t>(st.chunk)],
          peak)
          << "stage " << s << ", step " << step + 1;
    EXPECT_EQ(st.distinct_records, peak) << "stage " << s;
  }
}

TEST_P(StepExecutorSchedule, CallsBackOncePerForwardReduceAndStep) {
  const Case c = GetParam();
  const PipelineRun& run = pipeline_run(c);
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    std::vector<int> forwards;  // the micro-batch of each F on the rank, in order
    for (const Action& a : run.schedule.ranks[r])
      if (a.kind == ActionKind::Forward) forwards.push_back(a.micro_batch);
    ASSERT_EQ(forwards.size(), static_cast<size_t>(c.micro_batches * c.virtual_stages));
    for (const RankStep& rs : run.ranks[r]) {
      EXPECT_EQ(rs.fetched, forwards) << "rank " << r;
      EXPECT_EQ(rs.reduces, 1) << "rank " << r;
      EXPECT_EQ(rs.optimizer_steps, 1) << "rank " << r;
      EXPECT_TRUE(rs.backwards_done_at_reduce) << "rank " << r;
      EXPECT_TRUE(rs.reduced_before_step) << "rank " << r;
      EXPECT_GE(rs.timing.compute_seconds, 0.0);
      EXPECT_LE(rs.timing.compute_seconds, rs.timing.pipeline_seconds);
    }
  }
}

// The record contract of ToyStage::Record (the executor reads each input gradient for its send
// before the record takes the next micro-batch), and each stage boundary's gradient arrives as
// it was sent, for every micro-batch.
TEST_P(StepExecutorSchedule, SendsEachInputGradientBeforeItsRecordIsReused) {
  const Case c = GetParam();
  const PipelineRun& run = pipeline_run(c);
  for (size_t s = 0; s < run.stages.size(); ++s)
    for (const std::string& p : run.stages[s].log.problems)
      ADD_FAILURE() << "stage " << s << ": " << p;
  for (size_t s = 1; s < run.stages.size(); ++s) {
    const int u = run.stages[s].first_unit;  // receives from unit u - 1 on stage s - 1
    const ToyLog &from = run.stages[s].log, &to = run.stages[s - 1].log;
    ASSERT_EQ(from.din.at(u).size(), static_cast<size_t>(c.micro_batches));
    for (int m = 0; m < c.micro_batches; ++m) {
      EXPECT_TRUE(same_floats(to.dout.at(u - 1).at(m), from.din.at(u).at(m)))
          << "gradient into stage " << s - 1 << ", micro-batch " << m;
      EXPECT_TRUE(same_floats(from.in.at(u).at(m), to.out.at(u - 1).at(m)))
          << "activation into stage " << s << ", micro-batch " << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, StepExecutorSchedule,
                         ::testing::Values(Case{ScheduleKind::GPipe, 2, 3, 1},
                                           Case{ScheduleKind::GPipe, 3, 4, 1},
                                           Case{ScheduleKind::OneFOneB, 2, 4, 1},
                                           Case{ScheduleKind::OneFOneB, 3, 5, 1},
                                           Case{ScheduleKind::OneFOneB, 4, 2, 1},
                                           Case{ScheduleKind::Interleaved, 2, 4, 2},
                                           Case{ScheduleKind::Interleaved, 3, 3, 2},
                                           Case{ScheduleKind::Interleaved, 2, 2, 3},
                                           Case{ScheduleKind::ZeroBubbleH1, 2, 4, 1},
                                           Case{ScheduleKind::ZeroBubbleH1, 3, 5, 1},
                                           Case{ScheduleKind::ZeroBubbleH1, 4, 2, 1}),
                         [](const auto& info) { return case_name(info.param); });

// Data parallelism alone: F0 B0 F1 B1 ... on one rank, one record, the same numbers.
TEST(StepExecutor, SingleStageScheduleIsGradientAccumulation) {
  const Schedule s = single_stage_schedule(4);
  const PipelineRun run = run_pipeline(s, DType::F32);
  const Reference& ref = reference(4);
  ASSERT_EQ(run.stages.size(), 1u);
  const StageRun& st = run.stages[0];
  EXPECT_TRUE(st.log.problems.empty());
  for (size_t step = 0; step < 2; ++step) {
    const RankStep& rs = run.ranks[0][step];
    EXPECT_EQ(rs.step_loss, ref.loss);
    EXPECT_EQ(rs.returned, ref.loss);
    EXPECT_EQ(rs.fetched, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(rs.records, std::vector<int>{1});
    EXPECT_EQ(rs.reduces, 1);
    EXPECT_EQ(rs.optimizer_steps, 1);
    for (const auto& [name, g] : st.grads[step])
      EXPECT_TRUE(same_floats(g, ref.grads.at(name))) << name;
  }
  EXPECT_EQ(st.distinct_records, 1);
  EXPECT_EQ(st.log.passes,
            (std::vector<std::pair<int, bool>>{{0, false}, {1, false}, {2, false}, {3, true}}));
}

// Editing a generated list: the index of the action named `name` ("send B1") on `rank`.
size_t position(const Schedule& s, int rank, const std::string& name) {
  const auto& list = s.ranks[static_cast<size_t>(rank)];
  for (size_t i = 0; i < list.size(); ++i)
    if (to_string(list[i]) == name) return i;
  ADD_FAILURE() << name << " not on rank " << rank;
  return list.size();
}

// Valid lists the generators do not make, which the executor runs all the same (decision 24: any
// schedule): a split backward whose input gradient leaves after its W, a whole B in a zb-h1
// schedule, a BI + W in a 1F1B one.
TEST(StepExecutor, RunsEveryValidFormOfBackward) {
  std::vector<std::pair<std::string, Schedule>> cases;
  {
    Schedule s = make_schedule(ScheduleKind::ZeroBubbleH1, 2, 2);
    auto& r1 = s.ranks[1];
    const Action send = r1[position(s, 1, "send B1")];
    r1.erase(r1.begin() + static_cast<long>(position(s, 1, "send B1")));
    r1.insert(r1.begin() + static_cast<long>(position(s, 1, "W1")) + 1, send);
    cases.emplace_back("zb-h1, send B1 after W1", s);
  }
  {
    Schedule s = make_schedule(ScheduleKind::ZeroBubbleH1, 3, 3);
    auto& r1 = s.ranks[1];
    r1[position(s, 1, "BI1")].kind = ActionKind::Backward;
    r1.erase(r1.begin() + static_cast<long>(position(s, 1, "W1")));
    cases.emplace_back("zb-h1, B1 on rank 1", s);
  }
  {
    Schedule s = make_schedule(ScheduleKind::OneFOneB, 3, 3);
    auto& r1 = s.ranks[1];
    r1[position(s, 1, "B1")].kind = ActionKind::BackwardInput;
    r1.insert(r1.begin() + static_cast<long>(position(s, 1, "send B1")) + 1,
              Action{ActionKind::BackwardWeight, 1, 0});
    cases.emplace_back("1f1b, BI1 W1 on rank 1", s);
  }
  for (const auto& [what, s] : cases) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(validate_schedule(s).empty()) << validate_schedule(s).front();
    ASSERT_FALSE(check_deadlock(s).deadlocked());
    const PipelineRun run = run_pipeline(s, DType::F32);
    const Reference& ref = reference(s.micro_batches);
    EXPECT_EQ(run.ranks.back()[1].step_loss, ref.loss);
    for (size_t st = 0; st < run.stages.size(); ++st) {
      for (const std::string& p : run.stages[st].log.problems) ADD_FAILURE() << p;
      ASSERT_EQ(run.stages[st].log.passes.size(), static_cast<size_t>(s.micro_batches));
      EXPECT_TRUE(run.stages[st].log.passes.back().second);
      for (const auto& [name, g] : run.stages[st].grads[1])
        EXPECT_TRUE(same_floats(g, ref.grads.at(name))) << name;
      const RankStep& second = run.ranks[static_cast<size_t>(run.stages[st].rank)][1];
      EXPECT_EQ(second.records[0], count_in_flight(s).peak_in_flight[st]) << "stage " << st;
    }
  }
}

// A bf16 wire: every activation and input gradient that crosses a stage boundary arrives as the
// bf16 rounding (nearest even) of what was sent; inside a stage nothing is rounded.
TEST(StepExecutor, Bf16WireDeliversTheRoundedValues) {
  for (const Case c :
       {Case{ScheduleKind::OneFOneB, 3, 3, 1}, Case{ScheduleKind::Interleaved, 2, 2, 2},
        Case{ScheduleKind::ZeroBubbleH1, 2, 3, 1}}) {
    SCOPED_TRACE(case_name(c));
    const PipelineRun run = run_pipeline(
        make_schedule(c.kind, c.pp, c.micro_batches, c.virtual_stages), DType::BF16, 1);
    auto rounded = [](std::vector<float> v) {
      for (float& x : v) x = from_bf16(to_bf16(x));
      return v;
    };
    int changed = 0;  // elements the rounding changed (so that the test tests something)
    for (size_t s = 0; s < run.stages.size(); ++s) {
      const StageRun& st = run.stages[s];
      EXPECT_TRUE(st.log.problems.empty());
      for (int u = st.first_unit + 1; u <= st.last_unit; ++u)  // inside the stage: exact
        for (int m = 0; m < c.micro_batches; ++m)
          EXPECT_TRUE(same_floats(st.log.in.at(u).at(m), st.log.out.at(u - 1).at(m)));
      if (s == 0) continue;
      const int u = st.first_unit;
      const ToyLog& prev = run.stages[s - 1].log;
      for (int m = 0; m < c.micro_batches; ++m) {
        const std::vector<float>& sent = prev.out.at(u - 1).at(m);
        EXPECT_TRUE(same_floats(st.log.in.at(u).at(m), rounded(sent)))
            << "activation into stage " << s << ", micro-batch " << m;
        const std::vector<float>& sent_back = st.log.din.at(u).at(m);
        EXPECT_TRUE(same_floats(prev.dout.at(u - 1).at(m), rounded(sent_back)))
            << "gradient into stage " << s - 1 << ", micro-batch " << m;
        for (size_t i = 0; i < sent.size(); ++i)
          changed += (sent[i] != st.log.in.at(u).at(m)[i]) +
                     (sent_back[i] != prev.dout.at(u - 1).at(m)[i]);
      }
    }
    EXPECT_GT(changed, 0);
    // Close to the fp32 loss, not equal to it.
    const double loss = run.ranks.back()[0].step_loss, want = reference(c.micro_batches).loss;
    EXPECT_NEAR(loss, want, 1e-2 * want);
    EXPECT_NE(loss, want);
  }
}

}  // namespace
}  // namespace tessera::parallel
