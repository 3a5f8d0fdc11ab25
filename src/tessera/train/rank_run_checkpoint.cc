// RankRun's checkpoints: starting from initial values, weights or a checkpoint, and saving one
// (docs/FORMATS.md). A checkpoint is layout-free: every tensor whole under its global name.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "tessera/io/hf_config.h"
#include "tessera/io/safetensors.h"
#include "tessera/train/model_io.h"
#include "tessera/train/rank_run.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {
// The files of a Hugging Face or SentencePiece tokenizer (the file, or those of a folder, with the
// tokenizer_config.json beside it), copied beside saved weights so eval, sample and --init-from
// find them there.
void copy_tokenizer_files(const fs::path& source, const fs::path& dir) {
  const fs::path from = fs::is_directory(source) ? source : source.parent_path();
  std::vector<fs::path> files;
  if (fs::is_directory(source)) {
    for (const char* f : {"tokenizer.json", "tokenizer.model"})
      if (fs::exists(from / f)) files.push_back(from / f);
  } else {
    files.push_back(source);
  }
  if (fs::exists(from / "tokenizer_config.json")) files.push_back(from / "tokenizer_config.json");
  for (const fs::path& f : files) {
    const fs::path to = dir / f.filename();
    if (fs::exists(to) && fs::equivalent(f, to)) continue;
    io::write_file_atomic(to, io::read_file(f));
  }
}
}  // namespace

void RankRun::restore_or_initialize() {
  if (!plan_.ckpt) {
    if (cfg_.init_from.empty()) {
      engines_->initialize(cfg_.seed);
    } else {
      const io::SafetensorsFile weights = open_weights(cfg_.init_from);
      engines_->load_weights(weights);
      if (moe_bias_) moe_bias_->load(weights);
    }
    return;
  }
  const io::LoadedCheckpoint& ck = *plan_.ckpt;
  const std::string optimizer = engines_->optimizer().name();
  engines_->load_weights(ck.model);
  if (moe_bias_) moe_bias_->load(ck.model);
  TESSERA_CHECK_AS(ConfigError, ck.state.value("optimizer", optimizer) == optimizer, "checkpoint '",
                   ck.dir.string(), "' was written with ", config_key("optimizer"), " ",
                   ck.state.value("optimizer", std::string("?")), ", not ", optimizer);
  step_ = ck.step;
  // A state.json written by hand or damaged beyond its checksum must not end in "internal error".
  auto count = [&](const nlohmann::json& parent, const char* key) -> int64_t {
    TESSERA_CHECK_AS(IoError,
                     parent.is_object() && parent.contains(key) &&
                         parent.at(key).is_number_integer() && parent.at(key).get<int64_t>() >= 0,
                     "checkpoint '", ck.dir.string(),
                     "': state.json needs a non-negative integer '", key, "'");
    return parent.at(key).get<int64_t>();
  };
  engines_->load_optimizer_state(ck.optimizer, count(ck.state, "optimizer_steps"));
  TESSERA_CHECK_AS(IoError, ck.state.contains("sampler"), "checkpoint '", ck.dir.string(),
                   "': state.json has no 'sampler' position");
  const nlohmann::json& sp = ck.state.at("sampler");
  sampler_.set_position(data::SamplerPosition{count(sp, "epoch"), count(sp, "index")});
}

// No rank runs ahead of rank 0's file work, which may fail; the wait is bounded by --io-timeout
// (its length grows with the files and the storage, not with the network).
void RankRun::wait_for_rank0_file_work(const std::string& what) {
  const comm::BarrierOptions wait = file_work_wait(cfg_, world_.options());
  try {
    world_.barrier(wait).wait();
  } catch (const comm::TimeoutError& e) {
    throw comm::TimeoutError(detail::concat(e.what(), " (rank 0 ", what,
                                            ": --io-timeout bounds that wait, ",
                                            wait.timeout.count() / 1000.0, " s)"));
  }
}

namespace {

// What rank 0 writes for one checkpoint, self-contained: the background writer runs it while the
// run goes on (and, past --io-timeout, perhaps after the run has ended).
struct SaveJob {
  std::shared_ptr<Allocator> host;  // holds the host copies below (declared first: freed last)
  io::Checkpoint checkpoint;
  fs::path dir;
  nn::GPTConfig mcfg;
  DType export_dtype = DType::F32;
  uint64_t export_shard_bytes = 0;
  std::optional<data::BpeTokenizer> tokenizer;
  fs::path external_tokenizer;  // empty: none
  int64_t delay_ms = 0;         // TESSERA_SAVE_DELAY_MS (tests)
};

// TESSERA_SAVE_DELAY_MS: tests make a checkpoint write slow (it sleeps this long after its model
// file), so that a crash, a stop or a failure can come while it is in flight.
int64_t save_delay_ms() {
  const char* v = std::getenv("TESSERA_SAVE_DELAY_MS");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long long ms = std::strtoll(v, &end, 10);
  TESSERA_CHECK_AS(ConfigError, end && *end == '\0' && ms >= 0 && ms <= 3600 * 1000,
                   "TESSERA_SAVE_DELAY_MS must be a number of milliseconds in [0, 3600000], got '",
                   v, "'");
  return ms;
}

// Writes the checkpoint, then the exported weights and tokenizer beside it; the step directory.
std::string write_checkpoint(const SaveJob& job) {
  io::CheckpointOptions options;
  if (job.delay_ms > 0)
    options.after_file = [ms = job.delay_ms](const std::string& file) {
      if (file == io::kModelFile) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
  const fs::path dir = io::save_checkpoint(job.dir, job.checkpoint, options);
  export_weights(job.checkpoint.model, job.mcfg, job.dir, job.export_dtype, job.export_shard_bytes);
  if (job.tokenizer) job.tokenizer->save(job.dir / "tokenizer.json");
  if (!job.external_tokenizer.empty()) copy_tokenizer_files(job.external_tokenizer, job.dir);
  return dir.string();
}

// `tensors` copied into `buffers` (host memory of `host`; allocated anew when the names, shapes or
// dtypes differ from the last copy's): the gathered tensors may be views of the live parameters
// and optimizer state, which the next steps change. Returns the copies (sharing `buffers`).
io::NamedTensors host_copies(const io::NamedTensors& tensors, io::NamedTensors& buffers,
                             Allocator& host) {
  bool same = buffers.size() == tensors.size();
  for (size_t i = 0; same && i < tensors.size(); ++i)
    same = buffers[i].first == tensors[i].first &&
           buffers[i].second.shape() == tensors[i].second.shape() &&
           buffers[i].second.dtype() == tensors[i].second.dtype();
  if (!same) {
    buffers.clear();
    for (const auto& [name, t] : tensors)
      buffers.emplace_back(
          name, Tensor::empty(t.shape(), t.dtype(), MemCategory::Other, "checkpoint copy", &host));
  }
  for (size_t i = 0; i < tensors.size(); ++i) buffers[i].second.copy_from(tensors[i].second);
  return buffers;
}

}  // namespace

void RankRun::report_saved(const std::string& dir) {
  result_.checkpoint = dir;
  say(log_, pl_, "saved checkpoint " + dir);
}

void RankRun::save(int64_t at_step, bool last) {
  if (cfg_.save.empty()) return;
  // At most one checkpoint in flight: the one before is written first (bounded memory).
  finish_background_save();
  sync_host();
  // Gathered on every rank (collective); rank 0 writes.
  parallel::RankEngines::Gathered gathered = engines_->gather();
  if (moe_bias_) moe_bias_->check_identical(world_);
  const bool background = cfg_.save_async && !last;
  if (lead_) {
    SaveJob job;
    io::Checkpoint& c = job.checkpoint;
    c.model = std::move(gathered.weights);
    if (moe_bias_) moe_bias_->append_to(c.model);  // state beside the weights
    c.optimizer = std::move(gathered.optimizer_state);
    c.step = at_step;
    c.config = to_hf_config(plan_.mcfg);
    const data::SamplerPosition pos = sampler_.position();
    const optim::Optimizer& opt = engines_->optimizer();
    c.state = {{"seed", cfg_.seed},
               {"optimizer", opt.name()},
               {"optimizer_steps", opt.steps()},
               {"sampler", {{"epoch", pos.epoch}, {"index", pos.index}}},
               {"config", to_json(cfg_)},
               {"layout",
                {{"dp", cfg_.dp},
                 {"tp", cfg_.tp},
                 {"pp", cfg_.pp},
                 {"ep", cfg_.ep},
                 {"cp", cfg_.cp},
                 {"zero", cfg_.zero}}},
               {"data", plan_.pd.description}};
    if (cfg_.precision == kernels::Precision::BF16)  // what a resume with --bf16-gemm auto keeps
      c.state["bf16_gemm_path"] = kernels::to_string(plan_.bf16_gemm);
    job.dir = cfg_.save;
    job.mcfg = plan_.mcfg;
    job.export_dtype = cfg_.export_dtype;
    job.export_shard_bytes = static_cast<uint64_t>(cfg_.export_shard_mb * 1024 * 1024);
    job.tokenizer = plan_.pd.tokenizer;
    if (plan_.pd.external) job.external_tokenizer = plan_.pd.external_source;
    job.delay_ms = save_delay_ms();
    if (background) {
      // One host copy of what is saved, taken at this step boundary; the write goes on while
      // the next steps change the parameters and optimizer state.
      // The write before has ended (finish_background_save above): its buffers are free.
      if (!host_alloc_) host_alloc_ = std::make_shared<Allocator>("checkpoint host copy");
      job.host = host_alloc_;
      c.model = host_copies(c.model, host_model_, *host_alloc_);
      c.optimizer = host_copies(c.optimizer, host_optimizer_, *host_alloc_);
      say(log_, pl_,
          "writing checkpoint " + (fs::path(cfg_.save) / io::step_dir_name(at_step)).string() +
              " in the background");
      auto shared = std::make_shared<SaveJob>(std::move(job));
      writer_.start(detail::concat("checkpoint step ", at_step, " to '", cfg_.save, "'"),
                    [shared] { return write_checkpoint(*shared); });
    } else {
      report_saved(write_checkpoint(job));
    }
  }
  if (background) {
    // No barrier: nothing waits for the write but the next save, the end, a stop or an error.
    background_step_ = at_step;
    return;
  }
  wait_for_rank0_file_work(
      detail::concat("was writing checkpoint step ", at_step, " to '", cfg_.save, "'"));
}

void RankRun::finish_background_save() {
  if (background_step_ < 0) return;
  const int64_t step = background_step_;
  background_step_ = -1;
  if (lead_ && writer_.busy()) {
    try {
      report_saved(writer_.wait(timeout_of_seconds(cfg_.io_timeout), "--io-timeout"));
    } catch (...) {
      host_model_.clear();  // an abandoned write may still read them: never reused
      host_optimizer_.clear();
      throw;
    }
  }
  wait_for_rank0_file_work(detail::concat("was writing checkpoint step ", step, " to '", cfg_.save,
                                          "' in the background"));
}

void RankRun::poll_background_save() {
  if (!lead_ || !writer_.busy()) return;
  if (const std::optional<std::string> dir = writer_.poll()) report_saved(*dir);
}

void RankRun::finish_background_save_after_error() noexcept {
  if (!lead_ || !writer_.busy()) return;
  std::string message;
  try {
    report_saved(writer_.wait(timeout_of_seconds(cfg_.io_timeout), "--io-timeout"));
    return;
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown error";
  }
  try {
    const std::string text =
        "tessera: the checkpoint being written in the background failed too: " + message;
    if (log_)
      say(log_, pl_, text);
    else
      std::fprintf(stderr, "%s\n", text.c_str());
  } catch (...) {
  }
}

}  // namespace tessera::train
