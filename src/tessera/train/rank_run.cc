#include "tessera/train/rank_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>

#include "tessera/core/cpu_time.h"
#include "tessera/core/error.h"
#include "tessera/nn/context_parallel.h"
#include "tessera/optim/adamw.h"
#include "tessera/optim/sgd.h"
#include "tessera/parallel/gather.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/train/attempt_report.h"
#include "tessera/train/generate.h"
#include "tessera/train/hosts.h"
#include "tessera/train/stop_request.h"

namespace tessera::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
BatchObserver& batch_observer() {
  static BatchObserver observer;
  return observer;
}
}  // namespace

void set_batch_observer(BatchObserver observer) {
  batch_observer() = std::move(observer);
}

comm::Timeout timeout_of_seconds(double seconds) {
  return comm::Timeout(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

comm::BarrierOptions file_work_wait(const TrainConfig& cfg, const comm::CommOptions& copts) {
  comm::BarrierOptions o;
  o.timeout = std::max(timeout_of_seconds(cfg.io_timeout), copts.timeout);
  return o;
}

void say(std::FILE* log, ProgressLine* progress, const std::string& text) {
  if (progress)
    progress->message(text);
  else if (log)
    std::fprintf(log, "%s\n", text.c_str()), std::fflush(log);
}

namespace {

// The schedule a rank runs: data parallelism alone is the one-stage schedule.
parallel::Schedule step_schedule(const TrainConfig& cfg, int micro_batches) {
  if (cfg.pp == 1) return parallel::single_stage_schedule(micro_batches);
  return parallel::make_schedule(cfg.schedule, cfg.pp, micro_batches, cfg.virtual_stages);
}

parallel::MeshShape mesh_shape(const TrainConfig& cfg, comm::Communicator& world) {
  parallel::MeshShape s{cfg.dp, cfg.pp, cfg.tp, cfg.ep, cfg.cp};
  s.zero_shard = zero_shard_size(cfg.zero_shard_group, s, world);
  return s;
}

parallel::DataParallelOptions data_parallel_options(const TrainConfig& cfg) {
  return {parallel::zero_stage(cfg.zero), cfg.bucket_mb, cfg.overlap, cfg.grad_reduce_dtype,
          resolve(cfg.param_gather_dtype, cfg.precision)};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, Allocator& alloc,
                                                 std::vector<optim::Segment> segs, int64_t n) {
  if (cfg.optimizer == OptimizerKind::Sgd)
    return std::make_unique<optim::SGD>(std::move(segs), n,
                                        optim::SGDConfig{cfg.momentum, cfg.weight_decay}, alloc);
  return std::make_unique<optim::AdamW>(
      std::move(segs), n, optim::AdamWConfig{cfg.beta1, cfg.beta2, 1e-8f, cfg.weight_decay}, alloc);
}

void ensure_directory(const fs::path& dir, const char* what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TESSERA_CHECK_AS(IoError, !ec && fs::is_directory(dir), "cannot create the ", what,
                   " directory '", dir.string(), "': ", ec ? ec.message() : "not a directory");
}

// The mean loss per token over the first `windows_wanted` validation windows (all of them if
// fewer), `batch` rows per forward; loss_sum(rows, T) runs the windows fetched into in/tgt and
// returns their loss sum. The windows do not depend on `batch`, so every layout evaluates the
// same tokens. Under context parallelism each rank runs its share of the windows' tokens and the
// sums meet over the cp group.
double evaluate(const data::EvalWindows& windows, int batch, int64_t windows_wanted,
                std::vector<int32_t>& in, std::vector<int32_t>& tgt,
                const std::function<double(int, int)>& loss_sum, comm::Communicator& cp) {
  const int64_t n = std::min(windows_wanted, windows.num_windows());
  double sum = 0;
  int64_t count = 0;
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t rows = std::min<int64_t>(batch, n - first);
    windows.fetch(first, rows, in.data(), tgt.data());
    sum += loss_sum(static_cast<int>(rows), windows.seq_len());
    count += rows * windows.seq_len();
  }
  sum = parallel::all_reduce_sum(cp, sum);
  return count ? sum / static_cast<double>(count) : NAN;
}

}  // namespace

RankRun::Chunk::Chunk(const nn::GPTConfig& m, int micro, Allocator& alloc,
                      const nn::GPTLayout& layout, const parallel::Mesh& mesh)
    : model(m, micro, alloc, layout, mesh.tp(), mesh.ep(), mesh.cp()),
      timeline(model.num_units(), model.num_units() - 1) {
  model.add_hooks(&timeline);
}

nn::GPTLayout RankRun::model_layout(const parallel::UnitRange& units) const {
  nn::GPTLayout base;
  base.recompute = cfg_.recompute;
  base.gemm = {cfg_.precision, plan_.bf16_gemm};
  base.bf16_weight_copies = cfg_.bf16_weight_copies;
  base.sequence_parallel = cfg_.sp;
  base.activation_wire = resolve(cfg_.activation_comm_dtype, cfg_.precision);
  base.first_unit = units.first;
  base.last_unit = units.last;
  base.starts_mid_block = units.starts_mid_block;
  base.ends_mid_block = units.ends_mid_block;
  base.cp_comm = cfg_.cp_comm;
  // The parameters' gradient group is dp x cp (ZeRO shards over mesh_'s shard size: all of it,
  // or an HSDP shard group), the experts' edp x cp (parallel/mesh.h).
  return parallel::gpt_layout_for(dpo_, mesh_.shape().shard_size(), base,
                                  cfg_.dp / cfg_.ep * cfg_.cp);
}

RankRun::RankRun(const TrainConfig& cfg, const RunPlan& plan, comm::Communicator& world,
                 std::FILE* log)
    : cfg_(cfg),
      plan_(plan),
      world_(world),
      mesh_(world, mesh_shape(cfg, world)),
      split_(
          parallel::pipeline_split(plan.mcfg, cfg.seq, cfg.pp * cfg.virtual_stages, cfg.pp_split)),
      positions_(nn::context_positions(cfg.seq, cfg.cp, mesh_.cp_rank())),
      local_seq_(cfg.seq / cfg.cp),
      lead_(world.rank() == 0),
      log_(lead_ ? log : nullptr),
      alloc_("rank " + std::to_string(world.rank()),
             cfg.memory_limit.empty() ? 0 : parse_bytes(cfg.memory_limit)),
      alloc_scope_(alloc_),
      tracer_(cfg.trace.empty()
                  ? std::nullopt
                  : std::optional<Tracer>(std::in_place, world.rank(), plan.trace_origin)),
      trace_scope_(tracer_ ? &*tracer_ : nullptr),
      per_rank_(cfg.batch / cfg.dp),
      micro_(cfg.micro_batch > 0 ? cfg.micro_batch : per_rank_),
      n_micro_(per_rank_ / micro_),
      tokens_per_step_(static_cast<int64_t>(cfg.batch) * cfg.seq),
      dpo_(data_parallel_options(cfg)),
      schedule_(step_schedule(cfg, n_micro_)),
      sampler_(plan.pd.tokens, plan.split.train, data::SamplerOptions{cfg.seq, cfg.seed, true}),
      sched_{cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr_ratio},
      in_(static_cast<size_t>(micro_) * cfg.seq),
      tgt_(in_.size()),
      in_local_(cfg.cp > 1 ? static_cast<size_t>(micro_) * local_seq_ : 0),
      tgt_local_(in_local_.size()) {
  result_.rank = world.rank();
  result_.unigram_entropy = plan.unigram_entropy;
  recorder_ = world.flight_recorder();
  hosts_ = host_names(world);  // collective under MPI
  dumps_seen_ = dump_requests();
  if (plan.split.validation.size() > cfg.seq)
    val_.emplace(plan.pd.tokens, plan.split.validation, cfg.seq);
  for (int c = 0; c < cfg.virtual_stages; ++c) {
    const parallel::UnitRange& units =
        split_[static_cast<size_t>(schedule_.stage_of(mesh_.pp_rank(), c))];
    // A --device cuda rank's CPU model is the host copy of its parameters: records of one row.
    const int rows = cfg.device == Device::Cuda ? 1 : micro_;
    chunks_.push_back(std::make_unique<Chunk>(plan.mcfg, rows, alloc_, model_layout(units), mesh_));
  }
  engines_.emplace(stage_models(), mesh_, dpo_, alloc_,
                   [&](std::vector<optim::Segment> segs, int64_t n) {
                     return make_optimizer(cfg_, alloc_, std::move(segs), n);
                   });
  // This rank's rows (its cp share of each sequence; its slice of them under --sp).
  boundary_elems_ = first_model().hidden_elems(micro_, local_seq_);
  // MFU's denominator (choose_peak).
  if (lead_) peak_flops_ = plan.peak_flops_per_rank;
  const DType wire = resolve(cfg.activation_comm_dtype, cfg.precision);
  executor_.emplace(stage_models(), mesh_.pp(), wire);
  forward_.emplace(models(), mesh_.pp(), wire);
  if (plan.mcfg.moe.enabled()) moe_bias_.emplace(plan.mcfg, cfg.moe_bias_rate);
  restore_or_initialize();
  if (moe_bias_) moe_bias_->apply(models());
  if (cfg.device == Device::Cuda) {
    const bool mpi = std::string(world.backend()) == "mpi";
    device_.emplace(first_model(), engines_->engines().front()->optimizer(), micro_, cfg.seq,
                    cfg.precision, cfg.memory_limit.empty() ? 0 : parse_bytes(cfg.memory_limit),
                    mesh_.gradient_group(), "rank " + std::to_string(world.rank()),
                    device_for_rank(rank_in_machine(world.rank(), mpi)), cfg.device_comm);
    device_->upload();
    // MFU's denominator: the GPUs in use, not the ranks (ranks may share one). Each rank adds
    // 1 / (the ranks of this process on its device); MPI processes are taken to hold a GPU each.
    int sharing = 0;
    for (int r = 0; r < world.size(); ++r)
      sharing += !mpi && device_for_rank(r) == device_->device() ? 1 : 0;
    devices_in_use_ = parallel::all_reduce_sum(world, 1.0 / std::max(1, mpi ? 1 : sharing));
    if (lead_ && device_->peak_flops() > 0) peak_flops_ = device_->peak_flops();
  }
  result_.first_step = step_;
}

void RankRun::sync_host() {
  if (device_) device_->download();
}

void RankRun::device_train_step() {
  const auto t0 = Clock::now();
  const double wait0 = comm_wait_seconds();
  const double cpu0 = process_cpu_seconds();
  const float lr = sched_.at(step_);
  device_->begin_step();
  const data::SamplerPosition pos = sampler_.position();
  const nn::StepContext ctx{cfg_.seed, static_cast<uint64_t>(step_), true,
                            1.0f / static_cast<float>(tokens_per_step_)};
  double local = 0;
  for (int m = 0; m < n_micro_; ++m) {
    const int first = mesh_.dp_rank() * per_rank_ + m * micro_;
    sampler_.fetch(pos, cfg_.batch, first, first + micro_, in_.data(), tgt_.data());
    if (batch_observer())
      batch_observer()(world_.rank(), step_, first, micro_, cfg_.seq, in_.data());
    local +=
        device_->forward_backward(nn::Batch{in_.data(), tgt_.data(), micro_, cfg_.seq, first}, ctx);
  }
  device_->reduce_gradients();
  const double loss = global_loss(local);
  const double norm = device_->grad_norm();
  optimizer_step(loss, norm, lr);
  sampler_.set_position(sampler_.advance(pos, cfg_.batch));
  step_wait_ = comm_wait_seconds() - wait0;
  after_step(loss, norm, lr, std::chrono::duration<double>(Clock::now() - t0).count(),
             process_cpu_seconds() - cpu0, MoeStepStats{});
}

std::vector<nn::StageModel*> RankRun::stage_models() const {
  std::vector<nn::StageModel*> out;
  for (const auto& c : chunks_) out.push_back(&c->model);
  return out;
}

std::vector<nn::GPT*> RankRun::models() const {
  std::vector<nn::GPT*> out;
  for (const auto& c : chunks_) out.push_back(&c->model);
  return out;
}

std::string RankRun::first_non_finite() const {
  for (const auto& c : chunks_) {
    std::string where = c->model.first_non_finite();
    if (!where.empty()) return where;
  }
  return "";
}

// The step's mean loss per token: the sum over the last stage's tensor-parallel rank 0 of each
// replica (the other ranks add zeros), over the world.
double RankRun::global_loss(double local_loss_sum) {
  const bool counts = mesh_.pp_rank() == cfg_.pp - 1 && mesh_.tp_rank() == 0;
  return parallel::all_reduce_sum(world_, counts ? local_loss_sum : 0.0) / tokens_per_step_;
}

// The schedule's OptimizerStep: a finite loss and norm, clipping, the update (the engines', or
// a --device cuda rank's on its GPU).
void RankRun::optimizer_step(double loss, double norm, float lr) {
  if (!std::isfinite(loss) || !std::isfinite(norm)) {
    const std::string where =
        device_ ? "not searched (the model is on the device)" : first_non_finite();
    throw NumericError(detail::concat(
        "training diverged at step ", step_ + 1, ": the loss is ", loss, " and the gradient norm ",
        norm, "; first non-finite tensor: ",
        where.empty() ? "none found on rank " + std::to_string(world_.rank()) : where,
        ". Try a lower --lr or --grad-clip 1."));
  }
  if (device_) {
    if (cfg_.grad_clip > 0) device_->clip(norm, cfg_.grad_clip);
    device_->step(lr);
    return;
  }
  if (cfg_.grad_clip > 0) engines_->clip(norm, cfg_.grad_clip);
  engines_->step(lr);
}

nn::Batch RankRun::rank_batch(int B, int T, int64_t first) {
  if (cfg_.cp == 1) return nn::Batch{in_.data(), tgt_.data(), B, T, first};
  const int Tl = T / cfg_.cp;
  TESSERA_ASSERT(static_cast<int64_t>(Tl) * cfg_.cp == T &&
                     static_cast<size_t>(Tl) == positions_.size() &&
                     static_cast<size_t>(B) * Tl <= in_local_.size(),
                 "a micro-batch of ", B, " x ", T, " tokens for cp ", cfg_.cp);
  nn::slice_sequences(in_local_.data(), in_.data(), B, T, positions_.data(), Tl);
  nn::slice_sequences(tgt_local_.data(), tgt_.data(), B, T, positions_.data(), Tl);
  return nn::Batch{in_local_.data(), tgt_local_.data(), B, Tl, first, T, positions_.data()};
}

void RankRun::train_step() {
  if (device_) return device_train_step();
  const auto t0 = Clock::now();
  const double wait0 = comm_wait_seconds();
  const double cpu0 = process_cpu_seconds();
  const float lr = sched_.at(step_);
  for (const auto& c : chunks_) c->model.reset_moe_stats();
  engines_->begin_step();
  const data::SamplerPosition pos = sampler_.position();
  const int dp_rank = mesh_.dp_rank();
  double loss = 0, norm = 0;
  parallel::StepCallbacks cb;
  cb.fetch = [&](int m) {
    const int first = dp_rank * per_rank_ + m * micro_;  // global sample of this micro-batch
    // The cp ranks of a replica fetch the same sequences and run their shares of them.
    sampler_.fetch(pos, cfg_.batch, first, first + micro_, in_.data(), tgt_.data());
    if (batch_observer())
      batch_observer()(world_.rank(), step_, first, micro_, cfg_.seq, in_.data());
    return rank_batch(micro_, cfg_.seq, first);
  };
  cb.reduce_gradients = [&] { engines_->end_backward(); };
  cb.optimizer_step = [&](double local_loss_sum) {
    loss = global_loss(local_loss_sum);
    norm = engines_->grad_norm();
    optimizer_step(loss, norm, lr);
  };
  const nn::StepContext ctx{cfg_.seed, static_cast<uint64_t>(step_), true,
                            1.0f / static_cast<float>(tokens_per_step_)};
  executor_->run(schedule_, ctx, cb, boundary_elems_);
  traffic_ = engines_->traffic();
  if (step_ > result_.first_step) {  // the first step allocates; it is not timed
    timing_sum_.compute_seconds += executor_->timing().compute_seconds;
    timing_sum_.pipeline_seconds += executor_->timing().pipeline_seconds;
  }
  sampler_.set_position(sampler_.advance(pos, cfg_.batch));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  step_wait_ = comm_wait_seconds() - wait0;
  const double cpu_secs = process_cpu_seconds() - cpu0;
  // The step's routing over the job (collective): the metrics, and the next step's selection
  // biases (the same on every rank: the same counts, the same arithmetic).
  const MoeStepStats moe = moe_step_stats(plan_.mcfg, models(), mesh_.tp_rank() == 0, world_);
  if (moe_bias_) {
    moe_bias_->update(moe);
    moe_bias_->apply(models());
  }
  after_step(loss, norm, lr, secs, cpu_secs, moe);
}

// A stop request (stop_request.h) counts once every rank has seen it: one small all-reduce per
// step, so that all ranks stop after the same step.
int RankRun::agreed_stop() {
  int32_t signo = stop_requested();
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::Max;
  world_.all_reduce(&signo, 1, DType::I32, o).wait();
  return signo;
}

// Every rank's compute and wait seconds of the step: an all-reduce of 2 x world doubles (a
// maximum: the other ranks' slots are zeros), the same under threads and under mpirun. Kept apart
// from agreed_stop(), which runs after the step's metrics hook (TrainHooks::on_step may ask for
// a stop after this step).
void RankRun::exchange_step_times(double secs) {
  const int n = world_.size(), r = world_.rank();
  std::vector<double> v(2 * static_cast<size_t>(n), 0.0);
  const double wait = std::clamp(step_wait_, 0.0, secs);
  v[2 * static_cast<size_t>(r)] = secs - wait;
  v[2 * static_cast<size_t>(r) + 1] = wait;
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::Max;
  world_.all_reduce(v.data(), v.size(), DType::F64, o).wait();
  step_compute_.assign(static_cast<size_t>(n), 0.0);
  step_wait_ranks_.assign(static_cast<size_t>(n), 0.0);
  for (int p = 0; p < n; ++p) {
    step_compute_[static_cast<size_t>(p)] = v[2 * static_cast<size_t>(p)];
    step_wait_ranks_[static_cast<size_t>(p)] = v[2 * static_cast<size_t>(p) + 1];
  }
  compute_history_.push_back(step_compute_);
  if (compute_history_.size() > 5) compute_history_.erase(compute_history_.begin());
  // A safe point for a SIGUSR2 dump of this rank's flight recorder.
  if (const unsigned d = dump_requests(); d != dumps_seen_ && recorder_) {
    dumps_seen_ = d;
    const std::string path = recorder_->dump("signal", "");
    if (!path.empty()) say(log_, pl_, "SIGUSR2: flight recorder dumped to " + path);
  }
}

TrainResult RankRun::stop(int64_t at_step, bool saved, int signo) {
  result_.steps = at_step;
  result_.stopped_by = signo;
  if (pl_) pl_->finish();
  if (saved)  // this step's checkpoint, perhaps still being written in the background
    finish_background_save();
  else
    save(at_step, true);
  return std::move(result_);
}

void RankRun::validate(int64_t at_step) {
  if (!val_) return;
  TraceSpan span("validation", "eval");
  // --eval-batches batches of --batch sequences whatever the layout: every rank evaluates them
  // all, micro-batch by micro-batch.
  const int64_t windows = static_cast<int64_t>(cfg_.eval_batches) * cfg_.batch;
  const double v = evaluate(
      *val_, micro_, windows, in_, tgt_,
      [&](int rows, int T) {
        // A --device cuda rank runs whole sequences (no cp there): its batch is rank_batch's.
        const nn::Batch b = rank_batch(rows, T, 0);
        return device_ ? device_->evaluate(b)
                       : forward_->loss_sum(b, nn::StepContext{0, 0, false, 1.0f});
      },
      mesh_.cp());
  result_.last_val_loss = v;
  // With this rank's memory, so that a long run shows whether use and peaks stay flat
  // (scripts/soak.sh).
  nlohmann::json record = {{"step", at_step}, {"val_loss", v}, {"mem_in_use", alloc_.in_use()}};
  for (int c = 0; c < kNumMemCategories; ++c) {
    std::string key = "mem_peak_" + std::string(mem_category_name(static_cast<MemCategory>(c)));
    std::replace(key.begin(), key.end(), ' ', '_');
    record[key] = alloc_.peak(static_cast<MemCategory>(c));
  }
  metrics_->write(record);
  char buf[128];
  std::snprintf(buf, sizeof buf, "step %lld: val_loss %.4f", static_cast<long long>(at_step), v);
  say(log_, pl_, buf);
}

void RankRun::sample() {
  sync_host();
  const std::shared_ptr<const data::Tokenizer> tokenizer = plan_.pd.text_tokenizer();
  if (!tokenizer || cfg_.sample_tokens <= 0) return;
  // Every rank samples (ZeRO-3 gathers parameters, tensor parallelism the logits' vocabulary
  // slices, collectively); rank 0 prints.
  std::vector<uint32_t> p = tokenizer->encode_with_special_tokens(cfg_.prompt);
  std::vector<int32_t> prompt(p.begin(), p.end());
  if (prompt.empty())
    prompt.push_back(static_cast<int32_t>(tokenizer->special_tokens().eos.value_or(10)));
  const SampleOptions so{cfg_.sample_tokens, cfg_.temperature, cfg_.top_k, cfg_.seed};
  // Generation runs whole sequences on every rank. Under context parallelism the records hold a
  // rank's share of each sequence: the key/value cache's decode runs in pieces of that, but full
  // forwards (a pipeline, tensor or expert parallelism, ZeRO-3, a capacity) need a whole one.
  const nn::GPT* whole = forward_->whole_model();
  if (cfg_.cp > 1 && !(so.kv_cache && whole && whole->can_decode()) &&
      int64_t{micro_} * first_model().rows_per_sequence() < plan_.mcfg.block_size) {
    say(log_, nullptr,
        detail::concat("sample: skipped; with ", flag_of("cp"), " ", cfg_.cp,
                       " a rank's activations hold ", micro_, " x ",
                       first_model().rows_per_sequence(),
                       " rows, and this layout generates with whole-sequence forwards of up to ",
                       plan_.mcfg.block_size, " (", flag_of("micro_batch"), " >= ", flag_of("cp"),
                       " makes room; `tessera sample` generates from the saved "
                       "checkpoint)"));
    return;
  }
  const std::vector<int32_t> outs = generate(*forward_, prompt, so);
  const std::vector<uint32_t> ids(outs.begin(), outs.end());
  result_.sample = tokenizer->decode(ids);
  say(log_, nullptr, "sample:\n" + cfg_.prompt + result_.sample);
}

TrainResult RankRun::run() {
  try {
    return run_steps();
  } catch (...) {
    // Whatever failed, a checkpoint being written in the background is finished (or reported),
    // and the rank's flight recorder dumps its error (an injected exit keeps its own dump).
    finish_background_save_after_error();
    dump_error(std::current_exception());
    throw;
  }
}

TrainResult RankRun::run_steps() {
  print_header();
  metrics_.emplace(lead_ ? cfg_.metrics : std::string(), plan_.ckpt.has_value());
  if (log_) progress_.emplace(log_, cfg_.log_every);
  pl_ = progress_ ? &*progress_ : nullptr;
  if (!cfg_.save.empty() && lead_) ensure_directory(cfg_.save, "--save");
  // Rank 0 has made --save and written a probe file in it.
  if (!cfg_.save.empty()) wait_for_rank0_file_work("was creating '" + cfg_.save + "'");
  if (step_ == 0 && cfg_.eval_every > 0) validate(0);

  if (lead_) report_heartbeat(step_);  // training (again), for a supervisor
  for (; step_ < cfg_.steps; ++step_) {
    train_step();
    poll_background_save();
    const int64_t done = step_ + 1;
    if (lead_) report_heartbeat(done);
    if (cfg_.eval_every > 0 && done % cfg_.eval_every == 0 && done != cfg_.steps) validate(done);
    const bool saved = cfg_.save_every > 0 && done % cfg_.save_every == 0 && done != cfg_.steps;
    if (saved) save(done, false);
    if (done != cfg_.steps)
      if (const int signo = agreed_stop()) return stop(done, saved, signo);
  }
  result_.steps = step_;
  if (pl_) pl_->finish();
  if (cfg_.eval_every > 0 || cfg_.val_fraction > 0) validate(step_);
  save(step_, true);
  if (!step_times_.empty()) {
    std::vector<double> t = step_times_;
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    result_.tokens_per_s = tokens_per_step_ / t[t.size() / 2];
  }
  sample();
  report_memory();
  report_pipeline();
  write_timeline();
  return std::move(result_);
}

}  // namespace tessera::train
