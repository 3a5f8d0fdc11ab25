// RankRun's checkpoints: starting from initial values, weights or a checkpoint, and saving one
// (docs/FORMATS.md). A checkpoint is layout-free: every tensor whole under its global name.
#include <filesystem>
#include <nlohmann/json.hpp>
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

void RankRun::save(int64_t at_step) {
  if (cfg_.save.empty()) return;
  sync_host();
  // Gathered on every rank (collective); rank 0 writes.
  parallel::RankEngines::Gathered gathered = engines_->gather();
  if (moe_bias_) moe_bias_->check_identical(world_);
  if (lead_) {
    io::Checkpoint c;
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
    const fs::path dir = io::save_checkpoint(cfg_.save, c);
    result_.checkpoint = dir.string();
    export_weights(c.model, plan_.mcfg, cfg_.save, cfg_.export_dtype,
                   static_cast<uint64_t>(cfg_.export_shard_mb * 1024 * 1024));
    if (plan_.pd.tokenizer) plan_.pd.tokenizer->save(fs::path(cfg_.save) / "tokenizer.json");
    if (plan_.pd.external) copy_tokenizer_files(plan_.pd.external_source, cfg_.save);
    say(log_, pl_, "saved checkpoint " + dir.string());
  }
  wait_for_rank0_file_work(
      detail::concat("was writing checkpoint step ", at_step, " to '", cfg_.save, "'"));
}

}  // namespace tessera::train
