#include "tessera/train/trainer.h"

#include <cblas.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/train/device_steps.h"
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
  return comm::resolve_options(o);
}

}  // namespace

namespace {

// This process's rank of an mpirun job (one rank per process).
TrainResult run_mpi_rank(const TrainConfig& cfg, int threads, const comm::CommOptions& copts,
                         std::FILE* log) {
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
  if (world->rank() == 0) {
    choose_bf16_gemm(cfg, *plan);
    choose_peak(cfg, *plan, log != nullptr || !cfg.metrics.empty());  // rank 0 reports MFU
  }
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

}  // namespace

TrainResult run_training(const TrainConfig& cfg, std::FILE* log) {
  cfg.validate();
  if (cfg.device == Device::Cuda) {  // before any data is prepared
    const std::string why = device_unavailable_reason();
    TESSERA_CHECK_AS(ConfigError, why.empty(), config_key("device"), " cuda: ", why);
  }
  // Before anything measures: the MFU's peak is measured with the ranks' threads.
  const int threads = set_compute_threads(cfg.threads > 0 ? cfg.threads : 0, cfg.world());
  const comm::CommOptions copts = comm_options(cfg);
  if (comm::resolve_backend(cfg.backend) == comm::Backend::Mpi)
    return run_mpi_rank(cfg, threads, copts, log);
  RunPlan plan = make_plan(cfg, log);
  plan.threads = threads;
  choose_bf16_gemm(cfg, plan);
  choose_peak(cfg, plan, log != nullptr || !cfg.metrics.empty());
  // The ranks as threads of this process (one rank: its size-1 communicator short-circuits every
  // collective).
  TrainResult result;
  comm::run_inproc(
      cfg.world(),
      [&](comm::Communicator& world) {
        try {
          TrainResult r = train_rank(cfg, plan, world, log);
          if (world.rank() == 0) result = std::move(r);
        } catch (const std::exception& e) {  // every rank's error; the first is rethrown
          if (log && cfg.world() > 1)
            std::fprintf(log, "rank %d stopped: %s\n", world.rank(), e.what()), std::fflush(log);
          throw;
        }
      },
      copts);
  return result;
}

}  // namespace tessera::train
