#include "tessera/train/trainer.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/io/checkpoint.h"
#include "tessera/train/attempt_report.h"
#include "tessera/train/device_steps.h"
#include "tessera/train/model_io.h"
#include "tessera/train/rank_run.h"
#include "tessera/train/run_plan.h"

namespace tessera::train {

int set_compute_threads(int threads, int ranks_in_process) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int n = threads > 0 ? threads : std::max(1, cores / std::max(1, ranks_in_process));
  openblas_set_num_threads(n);
  return n;
}

namespace {

TrainResult train_rank(const TrainConfig& cfg, const RunPlan& plan, comm::Communicator& world,
                       std::FILE* log) {
  RankRun run(cfg, plan, world, log);
  return run.run();
}

// The communicators' options: --comm-timeout, and TESSERA_FAULT etc. checked before any work.
comm::CommOptions comm_options(const TrainConfig& cfg) {
  comm::CommOptions o;
  if (cfg.comm_timeout > 0) o.timeout = timeout_of_seconds(cfg.comm_timeout);
  o.flight_recorder = cfg.flight_recorder;  // "" leaves it to TESSERA_FLIGHT_RECORDER
  return comm::resolve_options(o);
}

}  // namespace

namespace {

// Rank 0's settings that every rank must share: one time origin for every rank's timeline (the
// monotonic clock is shared by the processes of one machine; across machines the tracks are
// aligned to within clock skew) and the bf16 GEMM path. Collective over `world`.
struct Rank0Settings {
  TraceClock::time_point trace_origin;
  kernels::Bf16Gemm bf16_gemm;
};
Rank0Settings rank0_settings(comm::Communicator& world, const RunPlan& plan) {
  int64_t shared[2] = {plan.trace_origin.time_since_epoch().count(),
                       static_cast<int64_t>(plan.bf16_gemm)};
  world.broadcast(shared, 2, DType::I64).wait();
  return {TraceClock::time_point(TraceClock::duration(shared[0])),
          static_cast<kernels::Bf16Gemm>(shared[1])};
}
void adopt(RunPlan& plan, const Rank0Settings& s) {
  plan.trace_origin = s.trace_origin;
  plan.bf16_gemm = s.bf16_gemm;
}

// This process's rank of an mpirun job (one rank per process).
TrainResult run_mpi_rank(const TrainConfig& cfg, int threads, const comm::CommOptions& copts,
                         std::FILE* log, const TrainHooks& hooks) {
  std::unique_ptr<comm::Communicator> world = comm::mpi_world(copts);
  auto key = [](const char* k) { return config_key(k); };
  const std::string cp = cfg.cp > 1 ? detail::concat(" x ", key("cp"), " ", cfg.cp) : "";
  const std::string cp_key = cfg.cp > 1 ? detail::concat(" x ", key("cp")) : "";
  TESSERA_CHECK_AS(ConfigError, world->size() == cfg.world(), "mpirun started ", world->size(),
                   " processes but ", key("pp"), " ", cfg.pp, " x ", key("dp"), " ", cfg.dp, cp,
                   " x ", key("tp"), " ", cfg.tp, " = ", cfg.world(), "; start ", cfg.world(),
                   " processes (mpirun -np ", cfg.world(), ") or choose ", key("pp"), " x ",
                   key("dp"), cp_key, " x ", key("tp"), " = ", world->size());
  // Rank 0 prepares the data (and fills the cache) before the others read it.
  std::optional<RunPlan> plan;
  if (world->rank() == 0) plan.emplace(make_plan(cfg, log));
  const comm::BarrierOptions ready = file_work_wait(cfg, copts);  // rank 0's, then everyone's
  world->barrier(ready).wait();
  if (world->rank() != 0) plan.emplace(make_plan(cfg, nullptr));
  plan->threads = threads;
  plan->on_step = hooks.on_step;
  if (world->rank() == 0) {
    choose_bf16_gemm(cfg, *plan);
    choose_peak(cfg, *plan, log != nullptr || !cfg.metrics.empty());  // rank 0 reports MFU
  }
  world->barrier(ready).wait();
  adopt(*plan, rank0_settings(*world, *plan));
  try {
    return train_rank(cfg, *plan, *world, log);
  } catch (...) {
    report_rank_fates(world->rank(), {fate_of(std::current_exception())});
    throw;
  }
}

// This process's ranks of an mpirun job with --ranks-per-process R: R threads, world rank =
// process x R + thread, on the hierarchical backend. As run_mpi_rank, with one plan per process
// (made by its first thread; the others read it).
TrainResult run_hierarchical_ranks(const TrainConfig& cfg, int threads,
                                   const comm::CommOptions& copts, std::FILE* log,
                                   const TrainHooks& hooks) {
  const int R = cfg.ranks_per_process;
  const char* np = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (np && std::atoi(np) > 0) {
    const int procs = std::atoi(np);
    const std::string fix = cfg.world() % R == 0
                                ? detail::concat("start ", cfg.world() / R,
                                                 " processes (mpirun -np ", cfg.world() / R, ")")
                                : detail::concat("choose a ", config_key("ranks_per_process"),
                                                 " that divides ", cfg.world());
    TESSERA_CHECK_AS(ConfigError, procs * R == cfg.world(), "mpirun started ", procs,
                     " processes of ", config_key("ranks_per_process"), " ", R, " = ", procs * R,
                     " ranks, but the layout has ", cfg.world(), "; ", fix);
  }
  std::optional<RunPlan> plan;  // this process's, read by its R ranks
  TrainResult result;
  comm::run_hierarchical(
      R,
      [&](comm::Communicator& world) {
        const bool first_here = world.rank() % R == 0;
        const comm::BarrierOptions ready = file_work_wait(cfg, copts);
        if (world.rank() == 0) plan.emplace(make_plan(cfg, log));
        world.barrier(ready).wait();  // rank 0 has prepared the data (and filled the cache)
        if (first_here && world.rank() != 0) plan.emplace(make_plan(cfg, nullptr));
        world.barrier(ready).wait();
        if (first_here) {
          plan->threads = threads;
          plan->on_step = hooks.on_step;
        }
        if (world.rank() == 0) {
          choose_bf16_gemm(cfg, *plan);
          choose_peak(cfg, *plan, log != nullptr || !cfg.metrics.empty());
        }
        world.barrier(ready).wait();
        const Rank0Settings settings = rank0_settings(world, *plan);
        world.barrier(ready).wait();  // every rank here has read the plan
        if (first_here) adopt(*plan, settings);
        world.barrier(ready).wait();
        try {
          TrainResult r = train_rank(cfg, *plan, world, log);
          if (first_here) result = std::move(r);
        } catch (...) {
          report_rank_fates(world.rank(), {fate_of(std::current_exception())});
          throw;
        }
      },
      copts);
  return result;
}

}  // namespace

TrainResult run_training(const TrainConfig& cfg, std::FILE* log, const TrainHooks& hooks) {
  cfg.validate();
  if (cfg.device == Device::Cuda) {  // before any data is prepared
    const std::string why = device_unavailable_reason();
    TESSERA_CHECK_AS(ConfigError, why.empty(), config_key("device"), " cuda: ", why);
  }
  // Before anything measures: the MFU's peak is measured with the ranks' threads.
  const int threads = set_compute_threads(cfg.threads > 0 ? cfg.threads : 0, cfg.world());
  const comm::CommOptions copts = comm_options(cfg);
  const bool mpi = comm::resolve_backend(cfg.backend) == comm::Backend::Mpi;
  TESSERA_CHECK_AS(ConfigError, mpi || cfg.ranks_per_process == 0, config_key("ranks_per_process"),
                   " ", cfg.ranks_per_process,
                   " applies under mpirun; without it every rank is a thread of this process "
                   "already (drop ",
                   config_key("ranks_per_process"), ", or start the processes with mpirun)");
  if (mpi && cfg.ranks_per_process > 0)
    return run_hierarchical_ranks(cfg, threads, copts, log, hooks);
  if (mpi) return run_mpi_rank(cfg, threads, copts, log, hooks);
  RunPlan plan = make_plan(cfg, log);
  plan.threads = threads;
  plan.on_step = hooks.on_step;
  choose_bf16_gemm(cfg, plan);
  choose_peak(cfg, plan, log != nullptr || !cfg.metrics.empty());
  // The ranks as threads of this process (one rank: its size-1 communicator short-circuits every
  // collective).
  TrainResult result;
  std::vector<RankFate> fates(cfg.world(), RankFate::Finished);  // for a supervisor
  try {
    comm::run_inproc(
        cfg.world(),
        [&](comm::Communicator& world) {
          try {
            TrainResult r = train_rank(cfg, plan, world, log);
            if (world.rank() == 0) result = std::move(r);
          } catch (const std::exception& e) {  // every rank's error; the first is rethrown
            fates[world.rank()] = fate_of(std::current_exception());
            if (log && cfg.world() > 1)
              std::fprintf(log, "rank %d stopped: %s\n", world.rank(), e.what()), std::fflush(log);
            throw;
          }
        },
        copts);
  } catch (...) {
    report_rank_fates(0, fates);
    throw;
  }
  return result;
}

namespace {

// A resumed run trains the checkpoint's model: a key that shapes the model, given on the command
// line or in --config with another value than the model's, would be ignored, so it is an error.
// (Not --vocab: the vocabulary a tokenizer reaches may be below it.) The core shape is read from
// the model's own config.json; the rest from the saved run's keys
// (unless that run took its shape from weights or a config.json, where they do not describe it).
void check_model_unchanged(const io::LoadedCheckpoint& c, const nlohmann::json& file,
                           const nlohmann::json& given) {
  const nlohmann::json saved = c.state.contains("config") ? c.state["config"] : nlohmann::json();
  const nn::GPTConfig m = from_hf_config(c.config, 0.0f);
  const std::map<std::string, nlohmann::json> actual = {{"arch", m.llama() ? "llama" : "gpt2"},
                                                        {"layers", m.n_layer},
                                                        {"dim", m.n_embd},
                                                        {"heads", m.n_head}};
  const bool saved_describes = saved.is_object() &&
                               saved.value("init_from", std::string()).empty() &&
                               saved.value("model", std::string()).empty();
  static constexpr const char* kShape[] = {"arch",
                                           "layers",
                                           "dim",
                                           "heads",
                                           "kv_heads",
                                           "ffn_dim",
                                           "rope_theta",
                                           "tie_embeddings",
                                           "qkv_bias",
                                           "moe_experts",
                                           "moe_top_k",
                                           "moe_every",
                                           "moe_capacity_factor",
                                           "moe_router",
                                           "moe_renormalize",
                                           "moe_ffn_dim",
                                           "moe_shared_ffn_dim",
                                           "moe_shared_gate"};
  for (const char* key : kShape) {
    const nlohmann::json* wanted = given.contains(key)  ? &given[key]
                                   : file.contains(key) ? &file[key]
                                                        : nullptr;
    if (wanted == nullptr) continue;
    nlohmann::json model_value;
    if (const auto it = actual.find(key); it != actual.end())
      model_value = it->second;
    else if (saved_describes && saved.contains(key))
      model_value = saved[key];
    else
      continue;
    if (*wanted == model_value) continue;
    if (std::string(key) == "heads" && *wanted == 0) continue;  // 0: the model's
    const auto shown = [](const nlohmann::json& v) {
      return v.is_string() ? v.get<std::string>() : v.dump();
    };
    throw ConfigError(detail::concat(
        config_key(key), " ", shown(*wanted), " is not the resumed model's ", shown(model_value),
        ": a resumed run trains the checkpoint's model; drop ", config_key(key),
        ", or start a new run from its weights with ", config_key("init_from")));
  }
}

}  // namespace

TrainConfig resolve_train_config(const nlohmann::json& file, const nlohmann::json& given) {
  nlohmann::json merged = to_json(TrainConfig{});
  auto overlay = [&](const nlohmann::json& j) {
    for (const auto& [k, v] : j.items()) merged[k] = v;
  };
  train_config_from_json(file);  // unknown keys and wrong types, before the checkpoint is read
  train_config_from_json(given);
  std::string resume = given.value("resume", std::string());
  if (resume.empty()) resume = file.value("resume", std::string());
  if (!resume.empty()) {
    // Only its saved config is needed here; the trainer verifies the checksums when it loads.
    io::LoadedCheckpoint c = io::load_checkpoint(resume, {.verify_checksums = false});
    if (c.state.contains("config")) overlay(c.state["config"]);
    check_model_unchanged(c, file, given);
  }
  overlay(file);
  overlay(given);
  merged["resume"] = resume;
  return train_config_from_json(merged);
}

}  // namespace tessera::train
