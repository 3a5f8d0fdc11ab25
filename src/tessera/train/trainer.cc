#include "tessera/train/trainer.h"

#include <cblas.h>
#include <time.h>

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
#include "tessera/kernels/gemm_peak.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/gpt.h"
#include "tessera/optim/adamw.h"
#include "tessera/optim/grad_clip.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/optim/sgd.h"
#include "tessera/parallel/data_parallel.h"
#include "tessera/parallel/gather.h"
#include "tessera/parallel/mesh.h"
#include "tessera/parallel/pipeline_split.h"
#include "tessera/parallel/schedule.h"
#include "tessera/parallel/schedule_generators.h"
#include "tessera/parallel/unit_timeline.h"
#include "tessera/train/generate.h"
#include "tessera/train/metrics.h"
#include "tessera/train/model_io.h"
#include "tessera/train/pipeline_forward.h"
#include "tessera/train/progress.h"
#include "tessera/train/step_executor.h"
#include "tessera/train/stop_request.h"

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

const char* dtype_label(DType t) {
  return t == DType::BF16 ? "bf16" : "fp32";
}

// What tensor- and pipeline-parallel activations and their gradients travel in.
DType activation_dtype(const TrainConfig& cfg) {
  return comm_dtype(cfg.activation_comm_dtype, cfg.precision, "--activation-comm-dtype");
}

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

// The mean loss per token over the first `windows_wanted` validation windows (all of them if
// fewer), `batch` rows per forward. The windows do not depend on `batch`, so every layout
// evaluates the same tokens.
double evaluate(PipelineForward& model, const data::EvalWindows& windows, int batch,
                int64_t windows_wanted, std::vector<int32_t>& in, std::vector<int32_t>& tgt) {
  const int64_t n = std::min(windows_wanted, windows.num_windows());
  double sum = 0;
  int64_t count = 0;
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t rows = std::min<int64_t>(batch, n - first);
    windows.fetch(first, rows, in.data(), tgt.data());
    nn::Batch mb{in.data(), tgt.data(), static_cast<int>(rows), windows.seq_len(), 0};
    sum += model.loss_sum(mb, nn::StepContext{0, 0, false, 1.0f});
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
  int threads = 1;  // compute (BLAS) threads per rank, set before anything measures
  // --bf16-gemm resolved (choose_bf16_gemm), and why when not by auto's measurement here.
  kernels::Bf16Gemm bf16_gemm = kernels::Bf16Gemm::Emulated;
  std::string bf16_gemm_chosen_by;
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
    mcfg.moe.experts = cfg.moe_experts;
    mcfg.moe.top_k = cfg.moe_top_k;
    mcfg.moe.every = cfg.moe_every;
    mcfg.moe.capacity_factor = cfg.moe_capacity_factor;
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
  // The training objective's coefficients come from the flags (like dropout), also when resuming.
  mcfg.moe.aux_loss = cfg.moe_aux_loss;
  mcfg.moe.z_loss = cfg.moe_z_loss;
  nn::validate(mcfg);
  check_tensor_parallel(mcfg.n_head, mcfg.n_embd, cfg.tp);
  TESSERA_CHECK_AS(ConfigError, cfg.ep == 1 || mcfg.moe.experts > 0, "--ep ", cfg.ep,
                   " needs a mixture-of-experts model, but the model has no experts");
  TESSERA_CHECK_AS(ConfigError, mcfg.moe.experts % cfg.ep == 0, "the model's ", mcfg.moe.experts,
                   " experts do not split over --ep ", cfg.ep,
                   " ranks; choose ep dividing the expert count");
  plan.split = data::split_train_val(plan.pd.tokens->size(), cfg.val_fraction, cfg.seq + 1);
  plan.unigram_entropy =
      data::unigram_entropy(*plan.pd.tokens, plan.split.train.begin, plan.split.train.end);
  return plan;
}

// CPU seconds of this process so far: every rank thread of an inproc job, and BLAS's threads.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

size_t model_state_peak(const Allocator& a) {
  return a.peak(MemCategory::Parameters) + a.peak(MemCategory::Gradients) +
         a.peak(MemCategory::OptimizerState);
}

// A step's mixture-of-experts statistics over the whole job (nn/moe_router.h defines them).
struct MoeStepStats {
  struct Layer {
    int layer = 0;
    double balance = 0;        // mean over sequences of balance_s (1 = perfectly balanced)
    double z = 0;              // mean over tokens of lse^2
    std::vector<double> load;  // [E] share of the router's assignments per expert
  };
  std::vector<Layer> layers;
  double aux_loss = 0, z_loss = 0;  // alpha sum_l balance_l, beta sum_l z_l: added to the objective
  double max_load_ratio = 0;        // the busiest expert's share over the mean share (1/E)
  double dropped_fraction = 0;      // dropped assignments / assignments
  double assignments = 0;
  std::vector<double> mean_load;  // [E] load averaged over the layers
};

// Milliseconds of a deadline given in (possibly fractional) seconds, rounded up.
comm::Timeout timeout_of_seconds(double seconds) {
  return comm::Timeout(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

// A wait for one rank's file work (rank 0 writing a checkpoint; under mpirun, rank 0 preparing the
// data and reading the checkpoint before the others, then the others doing the same):
// --io-timeout, never shorter than --comm-timeout, so that a large checkpoint on slow storage does
// not look like a hung peer.
comm::BarrierOptions file_work_wait(const TrainConfig& cfg, const comm::CommOptions& copts) {
  comm::BarrierOptions o;
  o.timeout = std::max(timeout_of_seconds(cfg.io_timeout), copts.timeout);
  return o;
}

// One rank of the job: its model (stage), data-parallel engine, data and reporting. A step is the
// schedule of this rank run by the StepExecutor; the rest of the methods are the run around it.
class RankRun {
 public:
  RankRun(const TrainConfig& cfg, const RunPlan& plan, comm::Communicator& world, std::FILE* log);
  TrainResult run();

 private:
  std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<optim::Segment> segs, int64_t n);
  void restore_or_initialize();
  void print_header();
  void train_step();
  void after_step(double loss, double norm, float lr, double secs, double cpu_secs);
  void save(int64_t at_step);
  int agreed_stop();
  TrainResult stop(int64_t at_step, bool saved, int signo);
  void validate(int64_t at_step);
  void sample();
  void report_memory();
  void report_pipeline();
  void write_timeline();

  // One model chunk of this rank (a pipeline stage; the whole model without pipelines).
  // With a mixture of experts, the experts have their own engine over the expert-data-parallel
  // group (parallel/mesh.h), so their gradients are summed over the ranks holding the same experts.
  struct Chunk {
    Chunk(const nn::GPTConfig& m, int micro, Allocator& alloc, const nn::GPTLayout& layout,
          comm::Communicator& dp, comm::Communicator& edp, const parallel::DataParallelOptions& o,
          parallel::ModelParallelGroups groups)
        : model(m, micro, alloc, layout),
          timeline(model.num_units(), model.num_units() - 1),
          engine((model.add_hooks(&timeline), model), dp, o, alloc, groups) {
      if (model.has_experts()) experts.emplace(model.expert_units(), edp, o, alloc, groups);
    }
    std::vector<parallel::DataParallel*> engines() {
      std::vector<parallel::DataParallel*> e{&engine};
      if (experts) e.push_back(&*experts);
      return e;
    }
    nn::GPT model;
    parallel::UnitTimeline timeline;
    parallel::DataParallel engine;
    std::optional<parallel::DataParallel> experts;
  };
  MoeStepStats moe_step_stats();
  std::vector<StageChunk> stage_chunks();
  std::vector<nn::GPT*> models();
  double global_grad_norm();
  std::string first_non_finite();
  nn::GPT& first_model() { return chunks_.front()->model; }

  const TrainConfig& cfg_;
  const RunPlan& plan_;
  comm::Communicator& world_;
  parallel::Mesh mesh_;
  const std::vector<parallel::UnitRange> split_;
  const bool lead_;
  std::FILE* log_;  // rank 0's log, null elsewhere
  TrainResult result_;
  Allocator alloc_;
  CurrentAllocatorScope alloc_scope_;
  std::optional<Tracer> tracer_;
  TracerScope trace_scope_;
  const int per_rank_, micro_, n_micro_;
  const int64_t tokens_per_step_;
  parallel::DataParallelOptions dpo_;
  nn::TensorParallelTraffic tp_traffic_;  // bytes this rank sent in tensor-parallel collectives
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::optional<StepExecutor> executor_;
  std::optional<PipelineForward> forward_;  // evaluation and sampling
  parallel::Schedule schedule_;
  int64_t boundary_elems_;
  StepTiming timing_sum_;  // over the steps after the first
  data::WindowSampler sampler_;
  std::optional<data::EvalWindows> val_;
  std::optional<MetricsWriter> metrics_;
  std::optional<ProgressLine> progress_;
  ProgressLine* pl_ = nullptr;
  const optim::LrSchedule sched_;
  std::vector<int32_t> in_, tgt_;
  std::vector<double> step_times_;
  double peak_flops_ = 0;  // the lead rank's GEMM peak (MFU's denominator, per rank)
  int64_t step_ = 0;
};

nn::GPTLayout model_layout(const TrainConfig& cfg, kernels::Bf16Gemm bf16_gemm,
                           const parallel::DataParallelOptions& dpo, const parallel::Mesh& mesh,
                           const parallel::UnitRange& units, nn::TensorParallelTraffic* traffic) {
  nn::GPTLayout base;
  base.recompute = nn::parse_recompute(cfg.recompute);
  base.gemm = {kernels::parse_precision(cfg.precision), bf16_gemm};
  base.bf16_weight_copies = nn::parse_weight_copies(cfg.bf16_weight_copies);
  if (cfg.tp > 1) base.tensor = nn::TensorSplit{&mesh.tp(), cfg.sp, traffic, activation_dtype(cfg)};
  base.first_unit = units.first;
  base.last_unit = units.last;
  base.starts_mid_block = units.starts_mid_block;
  base.ends_mid_block = units.ends_mid_block;
  if (cfg.ep > 1) base.experts = nn::ExpertSplit{&mesh.ep()};
  return parallel::gpt_layout_for(dpo, cfg.dp, base, cfg.dp / cfg.ep);
}

parallel::Schedule make_step_schedule(const TrainConfig& cfg, int micro_batches) {
  if (cfg.pp == 1) return parallel::single_stage_schedule(micro_batches);
  return parallel::make_schedule(cfg.schedule, cfg.pp, micro_batches, cfg.virtual_stages);
}

RankRun::RankRun(const TrainConfig& cfg, const RunPlan& plan, comm::Communicator& world,
                 std::FILE* log)
    : cfg_(cfg),
      plan_(plan),
      world_(world),
      mesh_(world, parallel::MeshShape{cfg.dp, cfg.pp, cfg.tp, cfg.ep}),
      split_(
          parallel::pipeline_split(plan.mcfg, cfg.seq, cfg.pp * cfg.virtual_stages, cfg.pp_split)),
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
      dpo_{cfg.zero, cfg.bucket_mb, cfg.overlap,
           float_dtype(cfg.grad_reduce_dtype, "--grad-reduce-dtype"),
           comm_dtype(cfg.param_gather_dtype, cfg.precision, "--param-gather-dtype")},
      schedule_(make_step_schedule(cfg, n_micro_)),
      boundary_elems_(0),  // set once the model exists (hidden_elems)
      sampler_(plan.pd.tokens, plan.split.train, data::SamplerOptions{cfg.seq, cfg.seed, true}),
      sched_{cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr_ratio},
      in_(static_cast<size_t>(micro_) * cfg.seq),
      tgt_(in_.size()) {
  result_.rank = world.rank();
  result_.unigram_entropy = plan.unigram_entropy;
  if (plan.split.validation.size() > cfg.seq)
    val_.emplace(plan.pd.tokens, plan.split.validation, cfg.seq);
  const parallel::ModelParallelGroups groups{world.size() > cfg.dp ? &world : nullptr,
                                             cfg.tp > 1 ? &mesh_.tp() : nullptr,
                                             cfg.sp ? &mesh_.stage() : nullptr};
  for (int c = 0; c < cfg.virtual_stages; ++c) {
    const parallel::UnitRange& units =
        split_[static_cast<size_t>(schedule_.stage_of(mesh_.pp_rank(), c))];
    chunks_.push_back(
        std::make_unique<Chunk>(plan.mcfg, micro_, alloc_,
                                model_layout(cfg, plan.bf16_gemm, dpo_, mesh_, units, &tp_traffic_),
                                mesh_.dp(), mesh_.edp(), dpo_, groups));
    for (parallel::DataParallel* e : chunks_.back()->engines())
      e->create_optimizer([&](std::vector<optim::Segment> segs, int64_t n) {
        return make_optimizer(std::move(segs), n);
      });
  }
  boundary_elems_ = first_model().hidden_elems(micro_, cfg.seq);  // this rank's rows under --sp
  if (lead_) {  // the progress line's MFU: against the given peak, or one measured now (~10 ms)
    const kernels::GemmModeScope mode(first_model().layout().gemm);
    peak_flops_ = cfg.peak_gflops > 0 ? cfg.peak_gflops * 1e9 : kernels::measure_gemm_peak(512, 2);
  }
  comm::Communicator* pp = cfg.pp > 1 ? &mesh_.pp() : nullptr;
  executor_.emplace(stage_chunks(), PipelineLinks{pp, mesh_.embedding(), activation_dtype(cfg)});
  forward_.emplace(models(), pp, activation_dtype(cfg));
  restore_or_initialize();
  result_.first_step = step_;
}

std::vector<StageChunk> RankRun::stage_chunks() {
  std::vector<StageChunk> out;
  for (auto& c : chunks_)
    out.push_back(StageChunk{&c->model, &c->engine, c->experts ? &*c->experts : nullptr});
  return out;
}

std::vector<nn::GPT*> RankRun::models() {
  std::vector<nn::GPT*> out;
  for (auto& c : chunks_) out.push_back(&c->model);
  return out;
}

double RankRun::global_grad_norm() {
  if (chunks_.size() == 1 && !chunks_.front()->experts) return chunks_.front()->engine.grad_norm();
  double sum = 0;  // each engine's share (experts: each ep rank its own), then one reduction
  for (auto& c : chunks_)
    for (parallel::DataParallel* e : c->engines()) sum += e->grad_norm_contribution();
  return std::sqrt(parallel::all_reduce_sum(world_, sum));
}

// Every MoE layer's statistics of the step, summed over the ranks (tensor-parallel replicas
// counted once) so that every rank holds the same numbers.
MoeStepStats RankRun::moe_step_stats() {
  MoeStepStats out;
  const nn::MoeConfig& m = plan_.mcfg.moe;
  if (!m.enabled()) return out;
  const int L = plan_.mcfg.n_layer, E = m.experts, W = 5 + E;
  std::vector<double> buf(static_cast<size_t>(L) * W, 0.0);
  if (mesh_.tp_rank() == 0)
    for (auto& c : chunks_)
      for (const nn::MixtureOfExperts* layer : c->model.moe_layers()) {
        const nn::MoeStats& s = layer->stats();
        double* b = buf.data() + static_cast<size_t>(s.layer) * W;
        b[0] += s.balance_sum, b[1] += s.sequences, b[2] += s.z_sum, b[3] += s.tokens;
        b[4] += s.dropped;
        for (int e = 0; e < E; ++e) b[5 + e] += s.load[static_cast<size_t>(e)];
      }
  world_.all_reduce(buf.data(), buf.size(), DType::F64).wait();
  double load_sum = 0, dropped = 0;
  out.mean_load.assign(static_cast<size_t>(E), 0.0);
  for (int l = 0; l < L; ++l) {
    const double* b = buf.data() + static_cast<size_t>(l) * W;
    if (!m.is_moe_layer(l) || b[1] == 0) continue;
    const double assignments = b[3] * m.top_k;
    MoeStepStats::Layer layer;
    layer.layer = l;
    layer.balance = b[0] / b[1];
    layer.z = b[2] / b[3];
    for (int e = 0; e < E; ++e) layer.load.push_back(b[5 + e] / assignments);
    out.aux_loss += m.aux_loss * layer.balance;
    out.z_loss += m.z_loss * layer.z;
    out.max_load_ratio =
        std::max(out.max_load_ratio, *std::max_element(layer.load.begin(), layer.load.end()) * E);
    for (int e = 0; e < E; ++e) out.mean_load[static_cast<size_t>(e)] += layer.load[e];
    load_sum += 1;
    dropped += b[4];
    out.assignments += assignments;
    out.layers.push_back(std::move(layer));
  }
  for (double& x : out.mean_load) x /= std::max(1.0, load_sum);
  out.dropped_fraction = out.assignments > 0 ? dropped / out.assignments : 0;
  return out;
}

std::string RankRun::first_non_finite() {
  for (auto& c : chunks_) {
    std::string where = c->model.first_non_finite();
    if (!where.empty()) return where;
  }
  return "";
}

std::unique_ptr<optim::Optimizer> RankRun::make_optimizer(std::vector<optim::Segment> segs,
                                                          int64_t n) {
  if (cfg_.optimizer == "sgd")
    return std::make_unique<optim::SGD>(std::move(segs), n,
                                        optim::SGDConfig{cfg_.momentum, cfg_.weight_decay}, alloc_);
  return std::make_unique<optim::AdamW>(
      std::move(segs), n, optim::AdamWConfig{cfg_.beta1, cfg_.beta2, 1e-8f, cfg_.weight_decay},
      alloc_);
}

void RankRun::restore_or_initialize() {
  if (!plan_.ckpt) {
    std::optional<io::SafetensorsFile> weights;
    if (!cfg_.init_from.empty()) weights.emplace(weights_file(cfg_.init_from));
    for (auto& c : chunks_)
      for (parallel::DataParallel* e : c->engines()) {
        if (weights)
          e->load_weights(*weights);
        else
          e->initialize(cfg_.seed);
      }
    return;
  }
  const io::LoadedCheckpoint& ck = *plan_.ckpt;
  optim::Optimizer& opt = chunks_.front()->engine.optimizer();
  for (auto& c : chunks_)
    for (parallel::DataParallel* e : c->engines()) e->load_weights(ck.model);
  TESSERA_CHECK_AS(ConfigError, ck.state.value("optimizer", opt.name()) == opt.name(),
                   "checkpoint '", ck.dir.string(), "' was written with --optimizer ",
                   ck.state.value("optimizer", std::string("?")), ", not ", opt.name());
  step_ = ck.step;
  for (auto& c : chunks_)
    for (parallel::DataParallel* e : c->engines()) e->load_optimizer_state(ck.optimizer);
  // A state.json written by hand or damaged beyond its checksum must not end in "internal error".
  auto count = [&](const nlohmann::json& parent, const char* key) -> int64_t {
    TESSERA_CHECK_AS(IoError,
                     parent.is_object() && parent.contains(key) &&
                         parent.at(key).is_number_integer() && parent.at(key).get<int64_t>() >= 0,
                     "checkpoint '", ck.dir.string(),
                     "': state.json needs a non-negative integer '", key, "'");
    return parent.at(key).get<int64_t>();
  };
  for (auto& c : chunks_)
    for (parallel::DataParallel* e : c->engines())
      e->optimizer().set_steps(count(ck.state, "optimizer_steps"));
  TESSERA_CHECK_AS(IoError, ck.state.contains("sampler"), "checkpoint '", ck.dir.string(),
                   "': state.json has no 'sampler' position");
  const nlohmann::json& sp = ck.state.at("sampler");
  sampler_.set_position(data::SamplerPosition{count(sp, "epoch"), count(sp, "index")});
}

void RankRun::print_header() {
  if (!log_) return;  // the lead rank prints
  const nn::GPTConfig& m = plan_.mcfg;
  char line[700];
  std::snprintf(
      line, sizeof line,
      "model: GPT-2 L=%d C=%d heads=%d context=%d vocab=%d, %.2fM parameters | batch %d x "
      "%d tokens = dp %d x %d micro-batches x %d | tp %d%s | pp %d | zero %d | recompute %s | %s "
      "backend, %d thread(s) per rank | train %lld tokens, val %lld | unigram entropy %.3f nats",
      m.n_layer, m.n_embd, m.n_head, m.block_size, m.vocab_size,
      static_cast<double>(first_model().num_params_without_wpe() +
                          static_cast<int64_t>(m.block_size) * m.n_embd) /
          1e6,
      cfg_.batch, cfg_.seq, cfg_.dp, n_micro_, micro_, cfg_.tp, cfg_.sp ? " sp" : "", cfg_.pp,
      cfg_.zero, cfg_.recompute.c_str(), std::string(world_.backend()).c_str(), plan_.threads,
      static_cast<long long>(plan_.split.train.size()),
      static_cast<long long>(plan_.split.validation.size()), plan_.unigram_entropy);
  say(log_, nullptr, line);
  say(log_, nullptr,
      std::string("precision: ") + kernels::to_string(first_model().layout().gemm.precision) +
          ", " +
          kernels::describe(first_model().layout().gemm, kernels::parse_bf16_gemm(cfg_.bf16_gemm),
                            plan_.bf16_gemm_chosen_by) +
          "; fp32 master weights, gradients and optimizer state; gradients reduced in " +
          cfg_.grad_reduce_dtype +
          (cfg_.zero == 3
               ? std::string(", parameters gathered in ") + dtype_label(dpo_.param_gather_dtype)
               : std::string()) +
          (cfg_.tp > 1 || cfg_.pp > 1
               ? std::string(", activations sent in ") + dtype_label(activation_dtype(cfg_))
               : std::string()) +
          "; MFU against " + format_rate(peak_flops_) + "FLOP/s per rank (" +
          (cfg_.peak_gflops > 0 ? "--peak-gflops" : "measured: a 512^3 GEMM") + ") x " +
          std::to_string(world_.size()) + " ranks");
  if (m.moe.enabled()) {
    char moe[320];
    std::snprintf(moe, sizeof moe,
                  "mixture of experts: %d experts, top-%d, every %d block(s) (blocks l with l %% "
                  "%d == %d), capacity factor %g%s, aux loss %g, z loss %g | ep %d (%d experts "
                  "per rank, expert gradients summed over %d ranks)",
                  m.moe.experts, m.moe.top_k, m.moe.every, m.moe.every, m.moe.every - 1,
                  static_cast<double>(m.moe.capacity_factor),
                  m.moe.capacity_factor > 0 ? "" : " (dropless)",
                  static_cast<double>(m.moe.aux_loss), static_cast<double>(m.moe.z_loss), cfg_.ep,
                  m.moe.experts / cfg_.ep, cfg_.dp / cfg_.ep);
    say(log_, nullptr, moe);
  }
  if (cfg_.pp > 1)
    say(log_, nullptr,
        "pipeline: " + schedule_.name + " schedule, " + std::to_string(cfg_.pp) + " stages x " +
            std::to_string(cfg_.virtual_stages) + " chunk(s), units per stage " +
            parallel::to_string(split_) + " (0 = embedding, " + std::to_string(m.n_layer + 1) +
            " = head; (attn) / (mlp): a block's half)");
  if (plan_.ckpt)
    say(log_, nullptr,
        "resumed from " + plan_.ckpt->dir.string() + " at step " + std::to_string(step_));
}

void RankRun::train_step() {
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_seconds();
  const float lr = sched_.at(step_);
  for (auto& c : chunks_) {
    c->model.reset_moe_stats();
    for (parallel::DataParallel* e : c->engines()) {
      e->reset_volume();
      e->begin_step();
    }
  }
  tp_traffic_ = {};
  const data::SamplerPosition pos = sampler_.position();
  const int dp_rank = mesh_.dp_rank();
  auto fetch = [&](int m) {
    const int first = dp_rank * per_rank_ + m * micro_;  // global sample of this micro-batch
    sampler_.fetch(pos, cfg_.batch, first, first + micro_, in_.data(), tgt_.data());
    return nn::Batch{in_.data(), tgt_.data(), micro_, cfg_.seq, first};
  };
  const nn::StepContext ctx{cfg_.seed, static_cast<uint64_t>(step_), true,
                            1.0f / static_cast<float>(tokens_per_step_)};
  double loss = 0, norm = 0;
  executor_->run(
      schedule_, mesh_.pp_rank(), ctx, fetch,
      [&](double local_loss_sum) {
        if (cfg_.pp == 1) {
          loss = parallel::all_reduce_sum(mesh_.dp(), local_loss_sum) / tokens_per_step_;
        } else {  // the last stage's tensor-parallel rank 0 of each replica has the loss
          const bool counts = mesh_.pp_rank() == cfg_.pp - 1 && mesh_.tp_rank() == 0;
          loss = parallel::all_reduce_sum(world_, counts ? local_loss_sum : 0.0) / tokens_per_step_;
        }
        norm = global_grad_norm();
        if (!std::isfinite(loss) || !std::isfinite(norm)) {
          const std::string where = first_non_finite();
          throw NumericError(detail::concat(
              "training diverged at step ", step_ + 1, ": the loss is ", loss,
              " and the gradient norm ", norm, "; first non-finite tensor: ",
              where.empty() ? "none found on rank " + std::to_string(world_.rank()) : where,
              ". Try a lower --lr or --grad-clip 1."));
        }
        for (auto& c : chunks_)
          for (parallel::DataParallel* e : c->engines()) {
            if (cfg_.grad_clip > 0) e->clip(norm, cfg_.grad_clip);
            e->optimizer_step(lr);
          }
      },
      boundary_elems_);
  if (step_ > result_.first_step) {  // the first step allocates; it is not timed
    timing_sum_.compute_seconds += executor_->timing().compute_seconds;
    timing_sum_.pipeline_seconds += executor_->timing().pipeline_seconds;
  }
  sampler_.set_position(sampler_.advance(pos, cfg_.batch));
  after_step(loss, norm, lr, std::chrono::duration<double>(Clock::now() - t0).count(),
             process_cpu_seconds() - cpu0);
}

void RankRun::after_step(double loss, double norm, float lr, double secs, double cpu_secs) {
  step_times_.push_back(secs);
  result_.losses.push_back(loss);
  double comm_bytes = tp_traffic_.total();
  for (auto& c : chunks_)
    for (parallel::DataParallel* e : c->engines()) comm_bytes += e->volume().total();
  result_.comm_bytes_per_step = comm_bytes;
  result_.tp_bytes_per_step = tp_traffic_.total();
  result_.pp_bytes_per_step = executor_->sent_bytes();
  StepStats st;
  st.step = step_ + 1;
  st.total_steps = cfg_.steps;
  st.loss = loss;
  st.lr = lr;
  st.grad_norm = norm;
  st.step_seconds = secs;
  st.tokens_per_s = tokens_per_step_ / secs;
  st.flops_per_s = first_model().flops_per_token(cfg_.seq) * tokens_per_step_ / secs;
  if (peak_flops_ > 0) st.mfu = st.flops_per_s / (peak_flops_ * world_.size());
  double mean = 0;
  const size_t recent = std::min<size_t>(step_times_.size(), 20);
  for (size_t i = step_times_.size() - recent; i < step_times_.size(); ++i) mean += step_times_[i];
  st.eta_seconds = mean / recent * static_cast<double>(cfg_.steps - step_ - 1);
  nlohmann::json record{{"step", st.step},
                        {"loss", loss},
                        {"lr", lr},
                        {"grad_norm", norm},
                        {"tokens_per_s", st.tokens_per_s},
                        {"flops_per_s", st.flops_per_s},
                        {"mfu", st.mfu},
                        {"step_ms", secs * 1e3},
                        {"process_cpu_ms", cpu_secs * 1e3},
                        {"comm_bytes_per_rank", comm_bytes},
                        {"tp_bytes_per_rank", tp_traffic_.total()},
                        {"pp_bytes_per_rank", executor_->sent_bytes()}};
  const MoeStepStats moe = moe_step_stats();
  if (!moe.layers.empty()) {
    st.moe = true;
    st.moe_aux_loss = moe.aux_loss;
    st.moe_z_loss = moe.z_loss;
    st.moe_max_load_ratio = moe.max_load_ratio;
    st.moe_dropped_fraction = moe.dropped_fraction;
    st.moe_load = moe.mean_load;
    nlohmann::json load = nlohmann::json::object(), balance = nlohmann::json::object();
    for (const MoeStepStats::Layer& l : moe.layers) {
      load["h." + std::to_string(l.layer)] = l.load;
      balance["h." + std::to_string(l.layer)] = l.balance;
    }
    record["moe_aux_loss"] = moe.aux_loss;
    record["moe_z_loss"] = moe.z_loss;
    record["moe_balance"] = balance;
    record["moe_load"] = load;
    record["moe_max_load_ratio"] = moe.max_load_ratio;
    record["moe_dropped_fraction"] = moe.dropped_fraction;
  }
  metrics_->write(record);
  if (pl_) pl_->update(st);
}

void RankRun::save(int64_t at_step) {
  if (cfg_.save.empty()) return;
  io::Checkpoint c;  // gathered on every rank (collective); rank 0 writes
  for (auto& ch : chunks_) {
    for (auto& t : ch->engine.full_weights()) c.model.push_back(std::move(t));
    for (auto& t : ch->engine.full_optimizer_state()) c.optimizer.push_back(std::move(t));
    if (!ch->experts) continue;
    // Each expert-parallel rank holds its own experts: gathered to expert-parallel rank 0.
    io::NamedTensors w = ch->experts->full_weights(), o = ch->experts->full_optimizer_state();
    if (cfg_.ep > 1) {
      w = parallel::gather_named_tensors(mesh_.ep(), std::move(w));
      o = parallel::gather_named_tensors(mesh_.ep(), std::move(o));
    }
    for (auto& t : w) c.model.push_back(std::move(t));
    for (auto& t : o) c.optimizer.push_back(std::move(t));
  }
  if (cfg_.pp > 1) {  // every stage's tensors to pipeline rank 0 (world rank 0 is one of them)
    c.model = parallel::gather_named_tensors(mesh_.pp(), std::move(c.model));
    c.optimizer = parallel::gather_named_tensors(mesh_.pp(), std::move(c.optimizer));
  }
  if (lead_) {
    c.step = at_step;
    c.config = to_hf_config(plan_.mcfg);
    const data::SamplerPosition pos = sampler_.position();
    const optim::Optimizer& opt = chunks_.front()->engine.optimizer();
    c.state = {
        {"seed", cfg_.seed},
        {"optimizer", opt.name()},
        {"optimizer_steps", opt.steps()},
        {"sampler", {{"epoch", pos.epoch}, {"index", pos.index}}},
        {"config", to_json(cfg_)},
        {"layout",
         {{"dp", cfg_.dp}, {"tp", cfg_.tp}, {"pp", cfg_.pp}, {"ep", cfg_.ep}, {"zero", cfg_.zero}}},
        {"data", plan_.pd.description}};
    if (cfg_.precision == "bf16")  // what a resume with --bf16-gemm auto keeps (choose_bf16_gemm)
      c.state["bf16_gemm_path"] = kernels::to_string(plan_.bf16_gemm);
    const fs::path dir = io::save_checkpoint(cfg_.save, c);
    result_.checkpoint = dir.string();
    export_weights(c.model, plan_.mcfg, cfg_.save,
                   float_dtype(cfg_.export_dtype, "--export-dtype"));
    if (plan_.pd.tokenizer) plan_.pd.tokenizer->save(fs::path(cfg_.save) / "tokenizer.json");
    say(log_, pl_, "saved checkpoint " + dir.string());
  }
  // No rank runs ahead of a checkpoint that may fail; the others wait while rank 0 writes.
  const comm::BarrierOptions wait = file_work_wait(cfg_, world_.options());
  try {
    world_.barrier(wait).wait();
  } catch (const comm::TimeoutError& e) {
    throw comm::TimeoutError(detail::concat(
        e.what(), " (rank 0 was writing checkpoint step ", at_step, " to '", cfg_.save,
        "': --io-timeout bounds that wait, ", wait.timeout.count() / 1000.0, " s)"));
  }
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

TrainResult RankRun::stop(int64_t at_step, bool saved, int signo) {
  result_.steps = at_step;
  result_.stopped_by = signo;
  if (pl_) pl_->finish();
  if (!saved) save(at_step);
  return std::move(result_);
}

void RankRun::validate(int64_t at_step) {
  if (!val_) return;
  TraceSpan span("validation", "eval");
  // --eval-batches batches of --batch sequences whatever the layout: every rank evaluates them
  // all, micro-batch by micro-batch.
  const double v = evaluate(*forward_, *val_, micro_,
                            static_cast<int64_t>(cfg_.eval_batches) * cfg_.batch, in_, tgt_);
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
  if (!plan_.pd.tokenizer || cfg_.sample_tokens <= 0) return;
  // Every rank samples (ZeRO-3 gathers parameters, tensor parallelism the logits' vocabulary
  // slices, collectively); rank 0 prints.
  std::vector<uint32_t> p = plan_.pd.tokenizer->encode(cfg_.prompt);
  std::vector<int32_t> prompt(p.begin(), p.end());
  if (prompt.empty())
    prompt.push_back(static_cast<int32_t>(plan_.pd.tokenizer->end_of_text().value_or(10)));
  const SampleOptions so{cfg_.sample_tokens, cfg_.temperature, cfg_.top_k, cfg_.seed};
  const std::vector<int32_t> outs = generate(*forward_, prompt, so);
  const std::vector<uint32_t> ids(outs.begin(), outs.end());
  result_.sample = plan_.pd.tokenizer->decode(ids);
  say(log_, nullptr, "sample:\n" + cfg_.prompt + result_.sample);
}

void RankRun::report_memory() {
  // Every rank's memory peaks, reported by rank 0.
  result_.memory_reports = parallel::all_gather_strings(world_, alloc_.report());
  const int64_t peak = static_cast<int64_t>(model_state_peak(alloc_));
  std::vector<int64_t> peaks(world_.size());
  world_.all_gather(&peak, peaks.data(), 1, DType::I64).wait();
  result_.model_state_peaks.assign(peaks.begin(), peaks.end());
  const int64_t total = static_cast<int64_t>(alloc_.peak());
  world_.all_gather(&total, peaks.data(), 1, DType::I64).wait();
  result_.memory_peaks.assign(peaks.begin(), peaks.end());
  for (const std::string& r : result_.memory_reports) say(log_, nullptr, "memory: " + r);
}

void RankRun::report_pipeline() {
  int in_flight = 0;
  for (size_t c = 0; c < chunks_.size(); ++c)
    in_flight += executor_->records_allocated(static_cast<int>(c));
  std::vector<int64_t> flights(world_.size());
  const int64_t mine = in_flight;
  world_.all_gather(&mine, flights.data(), 1, DType::I64).wait();
  result_.peak_micro_batches_in_flight.assign(flights.begin(), flights.end());
  std::vector<double> bubbles(world_.size());
  const double bubble = timing_sum_.bubble();
  world_.all_gather(&bubble, bubbles.data(), 1, DType::F64).wait();
  result_.measured_bubble = bubbles;
  if (cfg_.pp == 1 || !log_) return;
  // The first step allocates and is not timed: with one step there is no measurement.
  const bool measured = timing_sum_.pipeline_seconds > 0;
  std::string line = measured ? "pipeline: measured bubble per stage"
                              : "pipeline: bubble not measured (the first step is not timed; "
                                "run 2 or more steps)";
  char buf[96];
  for (int r = 0; r < cfg_.pp; ++r) {
    const int w = parallel::Mesh::world_rank(mesh_.shape(), 0, r, 0);
    const long long flight = flights[static_cast<size_t>(w)];
    if (measured)
      std::snprintf(buf, sizeof buf, " | %d: %.1f%% (%lld micro-batches in flight)", r,
                    100 * bubbles[static_cast<size_t>(w)], flight);
    else
      std::snprintf(buf, sizeof buf, " | %d: %lld micro-batches in flight", r, flight);
    line += buf;
  }
  say(log_, nullptr, line);
}

void RankRun::write_timeline() {
  if (!tracer_) return;
  nlohmann::json j = nlohmann::json::array();
  for (const TraceEvent& e : with_idle_spans(tracer_->events()))
    j.push_back({e.name, e.category, e.track, e.start_us, e.dur_us});
  const std::vector<std::string> all = parallel::all_gather_strings(world_, j.dump());
  if (!lead_) return;
  std::vector<std::pair<int, std::vector<TraceEvent>>> ranks;
  for (size_t r = 0; r < all.size(); ++r) {
    std::vector<TraceEvent> ev;
    for (const auto& e : nlohmann::json::parse(all[r]))
      ev.push_back(TraceEvent{e[0], e[1], e[2], e[3], e[4]});
    ranks.emplace_back(static_cast<int>(r), std::move(ev));
  }
  io::write_file_atomic(cfg_.trace, chrome_trace_json(ranks));
  say(log_, nullptr, "timeline written to " + cfg_.trace + " (open in ui.perfetto.dev)");
}

TrainResult RankRun::run() {
  print_header();
  metrics_.emplace(lead_ ? cfg_.metrics : std::string(), plan_.ckpt.has_value());
  if (log_) progress_.emplace(log_, cfg_.log_every);
  pl_ = progress_ ? &*progress_ : nullptr;
  if (!cfg_.save.empty() && lead_) ensure_directory(cfg_.save, "--save");
  // Rank 0 has made --save and written a probe file in it.
  if (!cfg_.save.empty()) world_.barrier(file_work_wait(cfg_, world_.options())).wait();
  if (step_ == 0 && cfg_.eval_every > 0) validate(0);

  for (; step_ < cfg_.steps; ++step_) {
    train_step();
    const int64_t done = step_ + 1;
    if (cfg_.eval_every > 0 && done % cfg_.eval_every == 0 && done != cfg_.steps) validate(done);
    const bool saved = cfg_.save_every > 0 && done % cfg_.save_every == 0 && done != cfg_.steps;
    if (saved) save(done);
    if (done != cfg_.steps)
      if (const int signo = agreed_stop()) return stop(done, saved, signo);
  }
  result_.steps = step_;
  if (pl_) pl_->finish();
  if (cfg_.eval_every > 0 || cfg_.val_fraction > 0) validate(step_);
  save(step_);
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

TrainResult train_rank(const TrainConfig& cfg, const RunPlan& plan, comm::Communicator& world,
                       std::FILE* log) {
  RankRun run(cfg, plan, world, log);
  return run.run();
}
}  // namespace

// --bf16-gemm resolved once per process before the ranks start (under mpirun, by rank 0 for all),
// so that every rank runs the same path: auto measures the two (kernels/precision.h), except
// that a resumed run keeps the path its checkpoint ran where this machine has it, so that it
// continues bitwise.
void choose_bf16_gemm(const TrainConfig& cfg, RunPlan& plan) {
  if (cfg.precision != "bf16") return;  // the path is never used
  const kernels::Bf16Gemm requested = kernels::parse_bf16_gemm(cfg.bf16_gemm);
  if (requested == kernels::Bf16Gemm::Auto && plan.ckpt &&
      plan.ckpt->state.contains("bf16_gemm_path")) {
    const nlohmann::json& v = plan.ckpt->state.at("bf16_gemm_path");
    TESSERA_CHECK_AS(
        IoError, v == "onednn" || v == "emulated", "checkpoint '", plan.ckpt->dir.string(),
        "': state.json's 'bf16_gemm_path' must be \"onednn\" or \"emulated\", got ", v.dump());
    const kernels::Bf16Gemm saved = kernels::parse_bf16_gemm(v.get<std::string>());
    if (saved == kernels::Bf16Gemm::Emulated || kernels::onednn_bf16_usable()) {
      plan.bf16_gemm = saved;
      plan.bf16_gemm_chosen_by = "--bf16-gemm auto: the path of the run resumed";
      return;
    }
  }
  plan.bf16_gemm = kernels::resolve_bf16_gemm(requested);
}

// The communicators' options: --comm-timeout, and TESSERA_FAULT etc. checked before any work.
comm::CommOptions comm_options(const TrainConfig& cfg) {
  comm::CommOptions o;
  if (cfg.comm_timeout > 0) o.timeout = timeout_of_seconds(cfg.comm_timeout);
  return comm::resolve_options(o);
}

TrainResult run_training(const TrainConfig& cfg, std::FILE* log) {
  cfg.validate();
  // Before anything measures: the MFU's peak is measured with the ranks' threads.
  const int threads = set_compute_threads(cfg.threads > 0 ? cfg.threads : 0, cfg.world());
  const comm::CommOptions copts = comm_options(cfg);
  const comm::Backend backend = comm::resolve_backend(comm::parse_backend(cfg.backend));
  if (backend == comm::Backend::Mpi) {
    std::unique_ptr<comm::Communicator> world = comm::mpi_world(copts);
    TESSERA_CHECK_AS(ConfigError, world->size() == cfg.world(), "mpirun started ", world->size(),
                     " processes but --pp ", cfg.pp, " x --dp ", cfg.dp, " x --tp ", cfg.tp, " = ",
                     cfg.world(), "; start ", cfg.world(), " processes (mpirun -np ", cfg.world(),
                     ") or choose --pp x --dp x --tp = ", world->size());
    // Rank 0 prepares the data (and fills the cache) before the others read it.
    std::optional<RunPlan> plan;
    if (world->rank() == 0) plan.emplace(make_plan(cfg, log));
    const comm::BarrierOptions ready = file_work_wait(cfg, copts);  // rank 0's, then everyone's
    world->barrier(ready).wait();
    if (world->rank() != 0) plan.emplace(make_plan(cfg, nullptr));
    plan->threads = threads;
    if (world->rank() == 0) choose_bf16_gemm(cfg, *plan);
    world->barrier(ready).wait();
    // One time origin for every rank's timeline: rank 0's (the monotonic clock is shared by the
    // processes of one machine; across machines the tracks are aligned to within clock skew);
    // and rank 0's bf16 GEMM path.
    int64_t shared[2] = {plan->trace_origin.time_since_epoch().count(),
                         static_cast<int64_t>(plan->bf16_gemm)};
    world->broadcast(shared, 2, DType::I64).wait();
    plan->trace_origin = TraceClock::time_point(TraceClock::duration(shared[0]));
    plan->bf16_gemm = static_cast<kernels::Bf16Gemm>(shared[1]);
    return train_rank(cfg, *plan, *world, log);
  }
  RunPlan plan = make_plan(cfg, log);
  plan.threads = threads;
  choose_bf16_gemm(cfg, plan);
  if (cfg.world() == 1) {
    // One rank: no threads to start; a size-1 communicator short-circuits every collective.
    TrainResult result;
    comm::run_inproc(
        1, [&](comm::Communicator& world) { result = train_rank(cfg, plan, world, log); }, copts);
    return result;
  }
  TrainResult result;
  comm::run_inproc(
      cfg.world(),
      [&](comm::Communicator& world) {
        try {
          TrainResult r = train_rank(cfg, plan, world, log);
          if (world.rank() == 0) result = std::move(r);
        } catch (const std::exception& e) {  // every rank's error; the first is rethrown
          if (log)
            std::fprintf(log, "rank %d stopped: %s\n", world.rank(), e.what()), std::fflush(log);
          throw;
        }
      },
      copts);
  return result;
}

}  // namespace tessera::train
