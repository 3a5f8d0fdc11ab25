#include "tessera/train/trainer.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/data/dataset.h"
#include "tessera/data/eval_windows.h"
#include "tessera/data/prepare.h"
#include "tessera/data/sampler.h"
#include "tessera/io/checkpoint.h"
#include "tessera/nn/gpt.h"
#include "tessera/optim/adamw.h"
#include "tessera/optim/grad_clip.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/optim/sgd.h"
#include "tessera/train/generate.h"
#include "tessera/train/metrics.h"
#include "tessera/train/model_io.h"
#include "tessera/train/progress.h"

namespace tessera::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int set_compute_threads(int threads) {
  int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(n);
  return n;
}

namespace {

void say(std::FILE* log, ProgressLine* progress, const std::string& text) {
  if (progress) progress->message(text);
  else if (log) std::fprintf(log, "%s\n", text.c_str()), std::fflush(log);
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

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, nn::ParameterSet& ps,
                                                 Allocator& alloc) {
  if (cfg.optimizer == "sgd")
    return std::make_unique<optim::SGD>(ps, optim::SGDConfig{cfg.momentum, cfg.weight_decay},
                                        alloc);
  return std::make_unique<optim::AdamW>(
      ps, optim::AdamWConfig{cfg.beta1, cfg.beta2, 1e-8f, cfg.weight_decay}, alloc);
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

}  // namespace

TrainResult run_training(const TrainConfig& cfg, std::FILE* log) {
  cfg.validate();
  TrainResult result;
  const int threads = set_compute_threads(cfg.threads);
  Allocator alloc("rank 0", cfg.memory_limit.empty() ? 0 : parse_bytes(cfg.memory_limit));
  CurrentAllocatorScope alloc_scope(alloc);

  // Where we start from: a checkpoint, weights, or nothing.
  std::optional<io::LoadedCheckpoint> ckpt;
  if (!cfg.resume.empty()) {
    TESSERA_CHECK_AS(ConfigError, fs::exists(cfg.resume), "--resume: '", cfg.resume,
                     "' does not exist");
    ckpt.emplace(io::load_checkpoint(cfg.resume));
  }

  // Model configuration: from the checkpoint, the weights, or the flags (vocabulary from the data).
  nn::GPTConfig mcfg;
  const bool from_weights = ckpt.has_value() || !cfg.init_from.empty();
  if (ckpt) {
    mcfg = from_hf_config(ckpt->config, cfg.dropout);
  } else if (!cfg.init_from.empty()) {
    mcfg = from_hf_config(config_of_weights(cfg.init_from, std::nullopt), cfg.dropout);
  }

  // Data. With existing weights, token ids are bounded by their vocabulary.
  data::DataOptions dopt;
  dopt.data = cfg.data;
  dopt.vocab_size = from_weights ? mcfg.vocab_size : cfg.vocab;
  dopt.cache_dir = cfg.cache_dir;
  if (ckpt) dopt.tokenizer = tokenizer_beside(ckpt->dir);
  else if (!cfg.init_from.empty()) dopt.tokenizer = tokenizer_beside(weights_file(cfg.init_from).parent_path());
  data::PreparedData pd = data::prepare_data(dopt);
  say(log, nullptr, "data: " + pd.description);
  if (!from_weights) {
    mcfg.n_layer = cfg.layers;
    mcfg.n_embd = cfg.dim;
    mcfg.n_head = cfg.heads;
    mcfg.block_size = cfg.seq;
    mcfg.vocab_size = static_cast<int>(pd.vocab_size);
    mcfg.dropout = cfg.dropout;
  }
  TESSERA_CHECK_AS(ConfigError, pd.vocab_size <= mcfg.vocab_size, "the data uses token ids up to ",
                   pd.vocab_size - 1, " but the model's vocabulary has only ", mcfg.vocab_size,
                   " entries");
  TESSERA_CHECK_AS(ConfigError, cfg.seq <= mcfg.block_size, "--seq ", cfg.seq,
                   " is longer than the model's context of ", mcfg.block_size, " positions");

  const int micro = cfg.micro_batch > 0 ? cfg.micro_batch : cfg.batch;
  const int n_micro = cfg.batch / micro;
  nn::GPT model(mcfg, micro, alloc);
  if (ckpt) {
    load_weights(model, ckpt->model);
  } else if (!cfg.init_from.empty()) {
    load_weights(model, io::SafetensorsFile(weights_file(cfg.init_from)));
  } else {
    model.initialize(cfg.seed);
  }
  auto opt = make_optimizer(cfg, model.params(), alloc);

  // Split and sample.
  data::TrainValSplit split = data::split_train_val(pd.tokens->size(), cfg.val_fraction, cfg.seq + 1);
  data::WindowSampler sampler(pd.tokens, split.train, data::SamplerOptions{cfg.seq, cfg.seed, true});
  std::optional<data::EvalWindows> val;
  if (split.validation.size() > cfg.seq) val.emplace(pd.tokens, split.validation, cfg.seq);
  result.unigram_entropy = data::unigram_entropy(*pd.tokens, split.train.begin, split.train.end);

  int64_t step = 0;
  if (ckpt) {
    step = ckpt->step;
    for (auto& [name, t] : opt->state(model.params())) {
      TESSERA_CHECK_AS(IoError, ckpt->optimizer.contains(name), "checkpoint '",
                       ckpt->dir.string(), "' has no optimizer state '", name,
                       "' (was it written with another --optimizer?)");
      ckpt->optimizer.read_f32(name, t.f32(), t.numel());
    }
    opt->set_steps(ckpt->state.at("optimizer_steps").get<int64_t>());
    sampler.set_position(data::SamplerPosition{ckpt->state.at("sampler").at("epoch").get<int64_t>(),
                                               ckpt->state.at("sampler").at("index").get<int64_t>()});
  }
  result.first_step = step;

  char line[512];
  std::snprintf(line, sizeof line,
                "model: GPT-2 L=%d C=%d heads=%d context=%d vocab=%d, %.2fM parameters | batch %d x "
                "%d tokens (%d micro-batches) | %d threads | train %lld tokens, val %lld | unigram "
                "entropy %.3f nats",
                mcfg.n_layer, mcfg.n_embd, mcfg.n_head, mcfg.block_size, mcfg.vocab_size,
                model.params().global_numel() / 1e6, cfg.batch, cfg.seq, n_micro, threads,
                static_cast<long long>(split.train.size()),
                static_cast<long long>(split.validation.size()), result.unigram_entropy);
  say(log, nullptr, line);
  if (ckpt) say(log, nullptr, "resumed from " + ckpt->dir.string() + " at step " + std::to_string(step));

  MetricsWriter metrics(cfg.metrics, ckpt.has_value());
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
    ensure_directory(cfg.save, "--save");
    io::Checkpoint c;
    c.step = at_step;
    c.config = to_hf_config(mcfg);
    c.model = named_weights(model);
    c.optimizer = opt->state(model.params());
    data::SamplerPosition pos = sampler.position();
    c.state = {{"seed", cfg.seed},
               {"optimizer", opt->name()},
               {"optimizer_steps", opt->steps()},
               {"sampler", {{"epoch", pos.epoch}, {"index", pos.index}}},
               {"config", to_json(cfg)},
               {"data", pd.description}};
    fs::path dir = io::save_checkpoint(cfg.save, c);
    export_weights(model, cfg.save);
    if (pd.tokenizer) pd.tokenizer->save(fs::path(cfg.save) / "tokenizer.json");
    say(log, pl, "saved checkpoint " + dir.string());
  };
  auto validate = [&](int64_t at_step) {
    if (!val) return;
    double v = evaluate(model, *val, micro, cfg.eval_batches, in, tgt);
    result.last_val_loss = v;
    metrics.write({{"step", at_step}, {"val_loss", v}});
    char buf[128];
    std::snprintf(buf, sizeof buf, "step %lld: val_loss %.4f", static_cast<long long>(at_step), v);
    say(log, pl, buf);
  };

  if (!cfg.save.empty()) ensure_directory(cfg.save, "--save");  // fail before training, not after
  if (step == 0 && cfg.eval_every > 0) validate(0);

  for (; step < cfg.steps; ++step) {
    auto t0 = Clock::now();
    const float lr = sched.at(step);
    model.params().zero_grads();
    const data::SamplerPosition pos = sampler.position();
    double loss_sum = 0;
    for (int m = 0; m < n_micro; ++m) {
      sampler.fetch(pos, cfg.batch, m * micro, (m + 1) * micro, in.data(), tgt.data());
      nn::Batch mb{in.data(), tgt.data(), micro, cfg.seq, static_cast<int64_t>(m) * micro};
      loss_sum += model.forward(mb, nn::StepContext{cfg.seed, static_cast<uint64_t>(step), true, loss_scale});
      model.backward();
    }
    sampler.set_position(sampler.advance(pos, cfg.batch));
    const double loss = loss_sum / static_cast<double>(tokens_per_step);
    double norm = std::sqrt(optim::grad_sum_of_squares(model.params()));
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      std::string where = model.first_non_finite();
      throw NumericError(detail::concat("training diverged at step ", step + 1, ": the loss is ",
                                        loss, " and the gradient norm ", norm,
                                        "; first non-finite tensor: ",
                                        where.empty() ? "none found" : where,
                                        ". Try a lower --lr or --grad-clip 1."));
    }
    if (cfg.grad_clip > 0) optim::clip_to_norm(model.params(), norm, cfg.grad_clip);
    opt->step(lr);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    step_times.push_back(secs);
    result.losses.push_back(loss);

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
    metrics.write({{"step", st.step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                   {"tokens_per_s", st.tokens_per_s}, {"flops_per_s", st.flops_per_s},
                   {"step_ms", secs * 1e3}});
    if (pl) pl->update(st);

    if (cfg.eval_every > 0 && st.step % cfg.eval_every == 0 && st.step != cfg.steps) validate(st.step);
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
  if (pd.tokenizer && cfg.sample_tokens > 0) {
    std::vector<uint32_t> p = pd.tokenizer->encode(cfg.prompt);
    std::vector<int32_t> prompt(p.begin(), p.end());
    if (prompt.empty()) prompt.push_back(static_cast<int32_t>(pd.tokenizer->end_of_text().value_or(10)));
    SampleOptions so{cfg.sample_tokens, cfg.temperature, cfg.top_k, cfg.seed};
    std::vector<int32_t> outs = generate(model, prompt, so);
    std::vector<uint32_t> ids(outs.begin(), outs.end());
    result.sample = pd.tokenizer->decode(ids);
    say(log, nullptr, "sample:\n" + cfg.prompt + result.sample);
  }
  say(log, nullptr, "memory: " + alloc.report());
  return result;
}

}  // namespace tessera::train
