#include "tessera/train/trainer.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>

#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/core/trace.h"
#include "tessera/data/dataset.h"
#include "tessera/data/eval_windows.h"
#include "tessera/data/prepare.h"
#include "tessera/data/sampler.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/checkpoint.h"
#include "tessera/io/hf_config.h"
#include "tessera/nn/gpt.h"
#include "tessera/optim/adamw.h"
#include "tessera/optim/grad_clip.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/optim/sgd.h"
#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/gather.h"
#include "tessera/parallel/mesh.h"
#include "tessera/train/generate.h"
#include "tessera/train/metrics.h"
#include "tessera/train/model_io.h"
#include "tessera/train/progress.h"

namespace tessera::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int set_compute_threads(int threads, int ranks_in_process) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int n = threads > 0 ? threads : std::max(1, cores / std::max(1, ranks_in_process));
  openblas_set_num_threads(n);
  return n;
}

namespace {

void say(std::FILE* log, ProgressLine* progress, const std::string& text) {
  if (progress)
    progress->message(text);
  else if (log)
    std::fprintf(log, "%s\n", text.c_str()), std::fflush(log);
}

void ensure_directory(const fs::path& dir, const char* what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TESSERA_CHECK_AS(IoError, !ec && fs::is_directory(dir), "cannot create the ", what,
                   " directory '", dir.string(), "': ", ec ? ec.message() : "not a directory");
}

// The tokenizer saved with a checkpoint or beside weights, if any.
std::optional<fs::path> tokenizer_beside(const fs::path& p) {
  for (fs::path dir : {p, p.parent_path(), p.parent_path().parent_path()}) {
    if (dir.empty()) continue;
    if (fs::exists(dir / "tokenizer.json")) return dir / "tokenizer.json";
  }
  return std::nullopt;
}

// Mean cross-entropy per target token over the first `max_batches` batches of `windows`.
double evaluate(nn::GPT& model, const data::EvalWindows& windows, int batch, int64_t max_batches,
                std::vector<int32_t>& in, std::vector<int32_t>& tgt) {
  int64_t batches = std::min(max_batches, windows.num_batches(batch));
  double sum = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    int64_t rows = windows.fetch_batch(b, batch, in.data(), tgt.data());
    nn::Batch mb{in.data(), tgt.data(), static_cast<int>(rows), windows.seq_len(), 0};
    sum += model.forward(mb, nn::StepContext{0, 0, false, 1.0f});
    count += rows * windows.seq_len();
  }
  return count ? sum / static_cast<double>(count) : NAN;
}

// Everything the ranks share, prepared once per process before they start.
struct RunPlan {
  std::optional<io::LoadedCheckpoint> ckpt;
  nn::GPTConfig mcfg;
  data::PreparedData pd;
  data::TrainValSplit split;
  double unigram_entropy = 0;
  TraceClock::time_point trace_origin = TraceClock::now();
};

RunPlan make_plan(const TrainConfig& cfg, std::FILE* log) {
  RunPlan plan;
  if (!cfg.resume.empty()) {
    TESSERA_CHECK_AS(ConfigError, fs::exists(cfg.resume), "--resume: '", cfg.resume,
                     "' does not exist");
    plan.ckpt.emplace(io::load_checkpoint(cfg.resume));
  }
  // Model configuration: from the checkpoint, the weights, or the flags (vocabulary from data).
  nn::GPTConfig& mcfg = plan.mcfg;
  const bool from_weights = plan.ckpt.has_value() || !cfg.init_from.empty();
  if (plan.ckpt)
    mcfg = from_hf_config(plan.ckpt->config, cfg.dropout);
  else if (!cfg.init_from.empty())
    mcfg = from_hf_config(
        config_of_weights(cfg.init_from,
                          cfg.heads > 0 ? std::optional<int>(cfg.heads) : std::nullopt),
        cfg.dropout);

  // Data. With existing weights, token ids are bounded by their vocabulary.
  data::DataOptions dopt;
  dopt.data = cfg.data;
  dopt.vocab_size = from_weights ? mcfg.vocab_size : cfg.vocab;
  dopt.cache_dir = cfg.cache_dir;
  if (plan.ckpt)
    dopt.tokenizer = tokenizer_beside(plan.ckpt->dir);
  else if (!cfg.init_from.empty())
    dopt.tokenizer = tokenizer_beside(weights_file(cfg.init_from).parent_path());
  plan.pd = data::prepare_data(dopt);
  say(log, nullptr, "data: " + plan.pd.description);
  if (!from_weights) {
    mcfg.n_layer = cfg.layers;
    mcfg.n_embd = cfg.dim;
    mcfg.n_head = cfg.new_model_heads();
    mcfg.block_size = cfg.seq;
    mcfg.vocab_size = static_cast<int>(plan.pd.vocab_size);
    mcfg.dropout = cfg.dropout;
  }
  TESSERA_CHECK_AS(ConfigError, plan.pd.vocab_size <= mcfg.vocab_size,
                   "the data uses token ids up to ", plan.pd.vocab_size - 1,
                   " but the model's vocabulary has only ", mcfg.vocab_size, " entries");
  TESSERA_CHECK_AS(ConfigError, cfg.seq <= mcfg.block_size, "--seq ", cfg.seq,
                   " is longer than the model's context of ", mcfg.block_size, " positions");
  nn::validate(mcfg);
  plan.split = data::split_train_val(plan.pd.tokens->size(), cfg.val_fraction, cfg.seq + 1);
  plan.unigram_entropy =
      data::unigram_entropy(*plan.pd.tokens, plan.split.train.begin, plan.split.train.end);
  return plan;
}

size_t model_state_peak(const Allocator& a) {
  return a.peak(MemCategory::Parameters) + a.peak(MemCategory::Gradients) +
         a.peak(MemCategory::OptimizerState);
}

// One rank of the job.
TrainResult train_rank(const TrainConfig& cfg, const RunPlan& plan, comm::Communicator& world,
                       std::FILE* log_all_ranks) {
  parallel::Mesh mesh(world, parallel::MeshShape{cfg.dp, 1, 1});
  const bool lead = world.rank() == 0;
  std::FILE* log = lead ? log_all_ranks : nullptr;
  TrainResult result;
  result.rank = world.rank();
  result.unigram_entropy = plan.unigram_entropy;
  Allocator alloc("rank " + std::to_string(world.rank()),
                  cfg.memory_limit.empty() ? 0 : parse_bytes(cfg.memory_limit));
  CurrentAllocatorScope alloc_scope(alloc);
  std::optional<Tracer> tracer;
  if (!cfg.trace.empty()) tracer.emplace(world.rank(), plan.trace_origin);
  TracerScope trace_scope(tracer ? &*tracer : nullptr);

  const nn::GPTConfig& mcfg = plan.mcfg;
  const int dp = mesh.shape().dp, dp_rank = mesh.dp_rank();
  const int per_rank = cfg.batch / dp;
  const int micro = cfg.micro_batch > 0 ? cfg.micro_batch : per_rank;
  const int n_micro = per_rank / micro;
  parallel::DataParallelOptions dpo{cfg.zero, cfg.bucket_mb, cfg.overlap};
  nn::GPT model(mcfg, micro, alloc, parallel::gpt_layout_for(dpo, dp));
  parallel::DataParallel engine(model, mesh.dp(), dpo, alloc);
  if (plan.ckpt)
    engine.load_weights(plan.ckpt->model);
  else if (!cfg.init_from.empty())
    engine.load_weights(io::SafetensorsFile(weights_file(cfg.init_from)));
  else
    engine.initialize(cfg.seed);
  engine.create_optimizer(
      [&](std::vector<optim::Segment> segs, int64_t n) -> std::unique_ptr<optim::Optimizer> {
        if (cfg.optimizer == "sgd")
          return std::make_unique<optim::SGD>(
              std::move(segs), n, optim::SGDConfig{cfg.momentum, cfg.weight_decay}, alloc);
        return std::make_unique<optim::AdamW>(
            std::move(segs), n, optim::AdamWConfig{cfg.beta1, cfg.beta2, 1e-8f, cfg.weight_decay},
            alloc);
      });
  optim::Optimizer& opt = engine.optimizer();

  data::WindowSampler sampler(plan.pd.tokens, plan.split.train,
                              data::SamplerOptions{cfg.seq, cfg.seed, true});
  std::optional<data::EvalWindows> val;
  if (plan.split.validation.size() > cfg.seq)
    val.emplace(plan.pd.tokens, plan.split.validation, cfg.seq);

  int64_t step = 0;
  if (plan.ckpt) {
    const io::LoadedCheckpoint& ck = *plan.ckpt;
    TESSERA_CHECK_AS(ConfigError, ck.state.value("optimizer", opt.name()) == opt.name(),
                     "checkpoint '", ck.dir.string(), "' was written with --optimizer ",
                     ck.state.value("optimizer", std::string("?")), ", not ", opt.name());
    step = ck.step;
    engine.load_optimizer_state(ck.optimizer);
    opt.set_steps(ck.state.at("optimizer_steps").get<int64_t>());
    sampler.set_position(data::SamplerPosition{ck.state.at("sampler").at("epoch").get<int64_t>(),
                                               ck.state.at("sampler").at("index").get<int64_t>()});
  }
  result.first_step = step;

  const int threads = set_compute_threads(cfg.threads > 0 ? cfg.threads : 0, dp);
  char line[640];
  std::snprintf(
      line, sizeof line,
      "model: GPT-2 L=%d C=%d heads=%d context=%d vocab=%d, %.2fM parameters | batch %d x "
      "%d tokens = dp %d x %d micro-batches x %d | zero %d | %s backend, %d thread(s) per "
      "rank | train %lld tokens, val %lld | unigram entropy %.3f nats",
      mcfg.n_layer, mcfg.n_embd, mcfg.n_head, mcfg.block_size, mcfg.vocab_size,
      model.params().global_numel() / 1e6, cfg.batch, cfg.seq, dp, n_micro, micro, cfg.zero,
      std::string(world.backend()).c_str(), threads,
      static_cast<long long>(plan.split.train.size()),
      static_cast<long long>(plan.split.validation.size()), plan.unigram_entropy);
  say(log, nullptr, line);
  if (plan.ckpt)
    say(log, nullptr,
        "resumed from " + plan.ckpt->dir.string() + " at step " + std::to_string(step));

  std::optional<MetricsWriter> metrics;
  metrics.emplace(lead ? cfg.metrics : std::string(), plan.ckpt.has_value());
  std::optional<ProgressLine> progress;
  if (log) progress.emplace(log, cfg.log_every);
  ProgressLine* pl = progress ? &*progress : nullptr;

  const optim::LrSchedule sched{cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr_ratio};
  const int64_t tokens_per_step = static_cast<int64_t>(cfg.batch) * cfg.seq;
  const float loss_scale = 1.0f / static_cast<float>(tokens_per_step);
  std::vector<int32_t> in(static_cast<size_t>(micro) * cfg.seq), tgt(in.size());
  std::vector<double> step_times;

  auto save = [&](int64_t at_step) {
    if (cfg.save.empty()) return;
    io::Checkpoint c;  // gathered on every rank (collective); rank 0 writes
    c.model = engine.full_weights();
    c.optimizer = engine.full_optimizer_state();
    if (lead) {
      c.step = at_step;
      c.config = to_hf_config(mcfg);
      data::SamplerPosition pos = sampler.position();
      c.state = {{"seed", cfg.seed},
                 {"optimizer", opt.name()},
                 {"optimizer_steps", opt.steps()},
                 {"sampler", {{"epoch", pos.epoch}, {"index", pos.index}}},
                 {"config", to_json(cfg)},
                 {"layout", {{"dp", dp}, {"zero", cfg.zero}}},
                 {"data", plan.pd.description}};
      fs::path dir = io::save_checkpoint(cfg.save, c);
      export_weights(c.model, mcfg, cfg.save);
      if (plan.pd.tokenizer) plan.pd.tokenizer->save(fs::path(cfg.save) / "tokenizer.json");
      say(log, pl, "saved checkpoint " + dir.string());
    }
    world.barrier().wait();  // no rank runs ahead of a checkpoint that may fail
  };
  auto validate = [&](int64_t at_step) {
    if (!val) return;
    TraceSpan span("validation", "eval");
    double v = evaluate(model, *val, micro, cfg.eval_batches, in, tgt);
    result.last_val_loss = v;
    metrics->write({{"step", at_step}, {"val_loss", v}});
    char buf[128];
    std::snprintf(buf, sizeof buf, "step %lld: val_loss %.4f", static_cast<long long>(at_step), v);
    say(log, pl, buf);
  };

  if (!cfg.save.empty() && lead) ensure_directory(cfg.save, "--save");
  if (!cfg.save.empty()) world.barrier().wait();
  if (step == 0 && cfg.eval_every > 0) validate(0);

  for (; step < cfg.steps; ++step) {
    auto t0 = Clock::now();
    const float lr = sched.at(step);
    engine.reset_volume();
    engine.begin_step();
    const data::SamplerPosition pos = sampler.position();
    double loss_sum = 0;
    for (int m = 0; m < n_micro; ++m) {
      const int first = dp_rank * per_rank + m * micro;  // global sample of this micro-batch
      sampler.fetch(pos, cfg.batch, first, first + micro, in.data(), tgt.data());
      engine.begin_micro_batch(m == n_micro - 1);
      nn::Batch mb{in.data(), tgt.data(), micro, cfg.seq, first};
      loss_sum += model.forward(
          mb, nn::StepContext{cfg.seed, static_cast<uint64_t>(step), true, loss_scale});
      model.backward();
      engine.end_backward();
    }
    sampler.set_position(sampler.advance(pos, cfg.batch));
    const double loss = parallel::all_reduce_sum(mesh.dp(), loss_sum) / tokens_per_step;
    const double norm = engine.grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      std::string where = model.first_non_finite();
      throw NumericError(detail::concat(
          "training diverged at step ", step + 1, ": the loss is ", loss, " and the gradient norm ",
          norm, "; first non-finite tensor: ",
          where.empty() ? "none found on rank " + std::to_string(world.rank()) : where,
          ". Try a lower --lr or --grad-clip 1."));
    }
    if (cfg.grad_clip > 0) engine.clip(norm, cfg.grad_clip);
    engine.optimizer_step(lr);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    step_times.push_back(secs);
    result.losses.push_back(loss);
    result.comm_bytes_per_step = engine.volume().total();

    StepStats st;
    st.step = step + 1;
    st.total_steps = cfg.steps;
    st.loss = loss;
    st.lr = lr;
    st.grad_norm = norm;
    st.step_seconds = secs;
    st.tokens_per_s = tokens_per_step / secs;
    st.flops_per_s = model.flops_per_token(cfg.seq) * tokens_per_step / secs;
    double mean = 0;
    size_t recent = std::min<size_t>(step_times.size(), 20);
    for (size_t i = step_times.size() - recent; i < step_times.size(); ++i) mean += step_times[i];
    st.eta_seconds = mean / recent * static_cast<double>(cfg.steps - step - 1);
    metrics->write({{"step", st.step},
                    {"loss", loss},
                    {"lr", lr},
                    {"grad_norm", norm},
                    {"tokens_per_s", st.tokens_per_s},
                    {"flops_per_s", st.flops_per_s},
                    {"step_ms", secs * 1e3},
                    {"comm_bytes_per_rank", engine.volume().total()}});
    if (pl) pl->update(st);

    if (cfg.eval_every > 0 && st.step % cfg.eval_every == 0 && st.step != cfg.steps)
      validate(st.step);
    if (cfg.save_every > 0 && st.step % cfg.save_every == 0 && st.step != cfg.steps) save(st.step);
  }
  result.steps = step;
  if (pl) pl->finish();
  if (cfg.eval_every > 0 || cfg.val_fraction > 0) validate(step);
  save(step);

  if (!step_times.empty()) {
    std::vector<double> s = step_times;
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    result.tokens_per_s = tokens_per_step / s[s.size() / 2];
  }
  if (plan.pd.tokenizer && cfg.sample_tokens > 0) {
    // Every rank samples (ZeRO-3 gathers parameters collectively); rank 0 prints.
    std::vector<uint32_t> p = plan.pd.tokenizer->encode(cfg.prompt);
    std::vector<int32_t> prompt(p.begin(), p.end());
    if (prompt.empty())
      prompt.push_back(static_cast<int32_t>(plan.pd.tokenizer->end_of_text().value_or(10)));
    SampleOptions so{cfg.sample_tokens, cfg.temperature, cfg.top_k, cfg.seed};
    std::vector<int32_t> outs = generate(model, prompt, so);
    std::vector<uint32_t> ids(outs.begin(), outs.end());
    result.sample = plan.pd.tokenizer->decode(ids);
    say(log, nullptr, "sample:\n" + cfg.prompt + result.sample);
  }

  // Every rank's memory peaks, reported by rank 0.
  result.memory_reports = parallel::all_gather_strings(world, alloc.report());
  const int64_t peak = static_cast<int64_t>(model_state_peak(alloc));
  std::vector<int64_t> peaks(world.size());
  world.all_gather(&peak, peaks.data(), 1, DType::I64).wait();
  result.model_state_peaks.assign(peaks.begin(), peaks.end());
  for (const std::string& r : result.memory_reports) say(log, nullptr, "memory: " + r);

  if (tracer) {
    std::vector<TraceEvent> mine = with_idle_spans(tracer->events());
    nlohmann::json j = nlohmann::json::array();
    for (const TraceEvent& e : mine)
      j.push_back({e.name, e.category, e.track, e.start_us, e.dur_us});
    std::vector<std::string> all = parallel::all_gather_strings(world, j.dump());
    if (lead) {
      std::vector<std::pair<int, std::vector<TraceEvent>>> ranks;
      for (size_t r = 0; r < all.size(); ++r) {
        std::vector<TraceEvent> ev;
        for (const auto& e : nlohmann::json::parse(all[r]))
          ev.push_back(TraceEvent{e[0], e[1], e[2], e[3], e[4]});
        ranks.emplace_back(static_cast<int>(r), std::move(ev));
      }
      io::write_file_atomic(cfg.trace, chrome_trace_json(ranks));
      say(log, nullptr, "timeline written to " + cfg.trace + " (open in ui.perfetto.dev)");
    }
  }
  return result;
}

}  // namespace

TrainResult run_training(const TrainConfig& cfg, std::FILE* log) {
  cfg.validate();
  const comm::Backend backend = comm::resolve_backend(comm::parse_backend(cfg.backend));
  if (backend == comm::Backend::Mpi) {
    std::unique_ptr<comm::Communicator> world = comm::mpi_world();
    TESSERA_CHECK_AS(ConfigError, world->size() == cfg.dp, "mpirun started ", world->size(),
                     " processes but --dp is ", cfg.dp, "; pass --dp ", world->size());
    // Rank 0 prepares the data (and fills the cache) before the others read it.
    std::optional<RunPlan> plan;
    if (world->rank() == 0) plan.emplace(make_plan(cfg, log));
    world->barrier().wait();
    if (world->rank() != 0) plan.emplace(make_plan(cfg, nullptr));
    // One time origin for every rank's timeline: rank 0's (the monotonic clock is shared by the
    // processes of one machine; across machines the tracks are aligned to within clock skew).
    int64_t origin = plan->trace_origin.time_since_epoch().count();
    world->broadcast(&origin, 1, DType::I64).wait();
    plan->trace_origin = TraceClock::time_point(TraceClock::duration(origin));
    return train_rank(cfg, *plan, *world, log);
  }
  RunPlan plan = make_plan(cfg, log);
  if (cfg.dp == 1) {
    // One rank: no threads to start; a size-1 communicator short-circuits every collective.
    TrainResult result;
    comm::run_inproc(
        1, [&](comm::Communicator& world) { result = train_rank(cfg, plan, world, log); });
    return result;
  }
  TrainResult result;
  comm::run_inproc(cfg.dp, [&](comm::Communicator& world) {
    TrainResult r = train_rank(cfg, plan, world, log);
    if (world.rank() == 0) result = std::move(r);
  });
  return result;
}

}  // namespace tessera::train
