// Internal to the trainer: one rank of a training job. Its model chunks (pipeline stages of the
// GPT; one without interleaving), the engines that reduce and update their gradients
// (parallel::RankEngines), the executor that runs the rank's schedule (parallel::StepExecutor),
// its data, and the run around the steps: validation, checkpoints, metrics, progress, reports.
// Every layout runs the same code; a parallelism the layout lacks is a mesh group of one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/core/allocator.h"
#include "tessera/core/trace.h"
#include "tessera/data/eval_windows.h"
#include "tessera/data/sampler.h"
#include "tessera/io/background_writer.h"
#include "tessera/nn/gpt.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/parallel/mesh.h"
#include "tessera/parallel/pipeline/pipeline_split.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/parallel/pipeline/step_executor.h"
#include "tessera/parallel/rank_engines.h"
#include "tessera/parallel/unit_timeline.h"
#include "tessera/train/device_steps.h"
#include "tessera/train/metrics.h"
#include "tessera/train/moe_bias.h"
#include "tessera/train/moe_stats.h"
#include "tessera/train/pipeline_forward.h"
#include "tessera/train/progress.h"
#include "tessera/train/run_plan.h"
#include "tessera/train/trainer.h"

namespace tessera::train {

class RankRun {
 public:
  RankRun(const TrainConfig& cfg, const RunPlan& plan, comm::Communicator& world, std::FILE* log);
  TrainResult run();

 private:
  // One model chunk of this rank, with the hook that puts its units on the timeline (added
  // first, so its spans include what the engines' hooks wait for).
  struct Chunk {
    Chunk(const nn::GPTConfig& m, int micro, Allocator& alloc, const nn::GPTLayout& layout,
          const parallel::Mesh& mesh);
    nn::GPT model;
    parallel::UnitTimeline timeline;
  };

  // Set-up (rank_run.cc).
  nn::GPTLayout model_layout(const parallel::UnitRange& units) const;
  std::vector<nn::StageModel*> stage_models() const;
  std::vector<nn::GPT*> models() const;
  nn::GPT& first_model() const { return chunks_.front()->model; }
  // The step (rank_run.cc).
  // The micro-batch of B whole sequences in in_/tgt_ from global sample `first` as this rank runs
  // it: whole, or its cp share (sliced into in_local_/tgt_local_ at positions_).
  nn::Batch rank_batch(int B, int T, int64_t first);
  void train_step();
  // The step of a --device cuda rank (device_steps.h): its micro-batches on the GPU, gradients
  // summed over the gradient group through host memory, the update on the GPU.
  void device_train_step();
  // Brings the device's parameters and optimizer state to the host model (before a save or a
  // sample reads them); nothing on a CPU rank.
  void sync_host();
  double global_loss(double local_loss_sum);
  void optimizer_step(double loss, double norm, float lr);
  std::string first_non_finite() const;
  int agreed_stop();
  // Collective, once a step: every rank's compute and communication-wait seconds of the step, in
  // one small all-reduce; keeps the last few steps for straggler naming.
  void exchange_step_times(double secs);
  // Seconds this rank has spent blocked in communication so far (its flight recorder's count).
  double comm_wait_seconds() const { return recorder_ ? recorder_->wait_seconds() : 0; }
  TrainResult stop(int64_t at_step, bool saved, int signo);
  void validate(int64_t at_step);
  void sample();
  // The steps and what follows them; run() adds the wait for a background write on errors.
  TrainResult run_steps();
  // Checkpoints (rank_run_checkpoint.cc).
  void restore_or_initialize();
  // Saves the checkpoint of `at_step` (collective). With --save-async, unless `last` (the final
  // or the stop's checkpoint, written before the run returns), rank 0 hands it to the background
  // writer and the ranks go on at once.
  void save(int64_t at_step, bool last);
  // Collective: rank 0 waits for the background write in flight (--io-timeout) and reports it,
  // and the others wait for rank 0 (a no-op when no --save-async save is outstanding).
  void finish_background_save();
  // Rank 0, between steps: reports a background write that has ended, or throws its error.
  void poll_background_save();
  // Rank 0, when the run fails: waits for the write in flight (bounded) and reports how it ended.
  void finish_background_save_after_error() noexcept;
  void report_saved(const std::string& dir);
  void wait_for_rank0_file_work(const std::string& what);
  // Reports (rank_run_report.cc).
  void print_header();
  std::string precision_line() const;
  void after_step(double loss, double norm, float lr, double secs, double cpu_secs,
                  const MoeStepStats& moe);
  // The rank whose compute time over the last few steps is more than 1.25x the median of the
  // others' (-1: none), and that ratio.
  std::pair<int, double> slowest_rank() const;
  // Dumps this rank's flight recorder with the error `e` (not for an injected exit).
  void dump_error(const std::exception_ptr& e) noexcept;
  void report_memory();
  void report_pipeline();
  void write_timeline();

  const TrainConfig& cfg_;
  const RunPlan& plan_;
  comm::Communicator& world_;
  parallel::Mesh mesh_;
  std::vector<std::string> hosts_;  // every world rank's host name (train/hosts.h)
  const std::vector<parallel::UnitRange> split_;
  // Context parallelism: this rank's load-balanced positions of each sequence ([seq / cp]; 0..seq-1
  // without it), and the rows per sequence it holds.
  const std::vector<int64_t> positions_;
  const int local_seq_;
  const bool lead_;
  std::FILE* log_;  // rank 0's log, null elsewhere
  TrainResult result_;
  Allocator alloc_;
  CurrentAllocatorScope alloc_scope_;
  std::optional<Tracer> tracer_;
  TracerScope trace_scope_;
  const int per_rank_, micro_, n_micro_;
  const int64_t tokens_per_step_;
  const parallel::DataParallelOptions dpo_;
  const parallel::Schedule schedule_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::optional<parallel::RankEngines> engines_;
  std::optional<parallel::StepExecutor> executor_;
  std::optional<PipelineForward> forward_;
  std::optional<DeviceSteps> device_;  // --device cuda
  std::optional<MoeBias> moe_bias_;    // every MoE layer's selection bias (the same on every rank)
  int64_t boundary_elems_ = 0;         // hidden-state elements a stage passes on per micro-batch
  parallel::StepTiming timing_sum_;    // over the steps after the first
  parallel::StepTraffic traffic_;      // of the last step
  data::WindowSampler sampler_;
  std::optional<data::EvalWindows> val_;
  std::optional<MetricsWriter> metrics_;
  std::optional<ProgressLine> progress_;
  ProgressLine* pl_ = nullptr;
  const optim::LrSchedule sched_;
  std::vector<int32_t> in_, tgt_;
  std::vector<int32_t> in_local_, tgt_local_;  // this cp rank's share of in_ and tgt_
  std::vector<double> step_times_;
  double peak_flops_ = 0;      // the lead rank's GEMM peak (MFU's denominator, per rank)
  double devices_in_use_ = 0;  // --device cuda: the GPUs the job runs on (MFU counts them)
  int64_t step_ = 0;
  // Stragglers: this rank's flight recorder (null on one rank), its wait in the last step, and
  // every rank's compute and wait seconds of the last few steps.
  std::shared_ptr<comm::FlightRecorder> recorder_;
  double step_wait_ = 0;
  unsigned dumps_seen_ = 0;  // SIGUSR2 requests already dumped (stop_request.h)
  std::vector<std::vector<double>> compute_history_;    // [step][world rank], oldest first
  std::vector<double> step_compute_, step_wait_ranks_;  // the last step's, per world rank
  // --save-async: rank 0's writer, and on every rank the step of the checkpoint handed to it
  // that no finish_background_save() has waited for yet (-1: none).
  io::BackgroundWriter writer_;
  int64_t background_step_ = -1;
  // Rank 0's host copy of what a background save writes: allocated at the first one and reused
  // (its pages already mapped) by the next, which starts only once the write before has ended.
  std::shared_ptr<Allocator> host_alloc_;
  io::NamedTensors host_model_, host_optimizer_;
};

// Milliseconds of a deadline given in (possibly fractional) seconds, rounded up.
comm::Timeout timeout_of_seconds(double seconds);
// A wait for one rank's file work (rank 0 writing a checkpoint; under mpirun, rank 0 preparing the
// data and reading the checkpoint before the others, then the others doing the same):
// --io-timeout, never shorter than --comm-timeout, so that a large checkpoint on slow storage does
// not look like a hung peer.
comm::BarrierOptions file_work_wait(const TrainConfig& cfg, const comm::CommOptions& copts);
// A message on rank 0's log: through the progress line when there is one.
void say(std::FILE* log, ProgressLine* progress, const std::string& text);

}  // namespace tessera::train
