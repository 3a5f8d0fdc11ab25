// The training loop of one rank: data, model, optimizer, steps with gradient accumulation over
// micro-batches, validation, checkpoints, metrics, progress and a sample at the end.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessera/train/train_config.h"

namespace tessera::train {

struct TrainResult {
  int rank = 0;                // world rank that produced this result
  int64_t first_step = 0;      // the step the run started at (> 0 when resumed)
  int64_t steps = 0;           // the step count reached
  std::vector<double> losses;  // training loss of each step run, in order
  double last_val_loss = -1;   // -1 when validation is disabled
  double unigram_entropy = 0;  // of the training tokens, nats/token (the baseline to beat)
  double tokens_per_s = 0;     // median over the run's steps
  std::string sample;          // generated text (empty when disabled or no tokenizer)
  std::vector<std::string> memory_reports;  // one line per rank: allocator peaks by category
  std::vector<size_t> model_state_peaks;    // per rank: peak parameters + gradients + optimizer
  std::vector<size_t> memory_peaks;         // per rank: the allocator's peak over all categories
  // Bytes rank 0 sent in its last step (ring accounting, Communicator::traffic): data- and
  // tensor-parallel collectives, of which tensor-parallel ones.
  double comm_bytes_per_step = 0;
  double tp_bytes_per_step = 0;
  double pp_bytes_per_step = 0;  // bytes rank 0 sent to other pipeline stages (not in the above)
  double ep_bytes_per_step = 0;  // bytes rank 0 sent in expert-parallel exchanges (not above)
  double cp_bytes_per_step = 0;  // bytes rank 0 sent to its context-parallel ranks (not above)
  // Per world rank: the most micro-batches whose activations it held at once (summed over its
  // model chunks), and the measured pipeline bubble (idle share of the time from the step's start
  // to the end of the rank's last forward or backward, over the steps after the first).
  std::vector<int> peak_micro_batches_in_flight;
  std::vector<double> measured_bubble;
  // A clean stop (stop_request.h): the signal that stopped the run after `steps` steps, or 0 when
  // it ran to the end. Rank 0: the checkpoint saved last ("" when none).
  int stopped_by = 0;
  std::string checkpoint;
};

// What a caller of run_training may add to a run (the Python package's tessera.train does).
struct TrainHooks {
  // Rank 0, after each training step: the step's metrics record, as --metrics writes it
  // ({"step", "loss", "lr", "grad_norm", "tokens_per_s", ...}). It runs on rank 0's thread while
  // the other ranks go on to the next step's first collective. To stop the run after this step
  // (with a checkpoint when --save is set), call request_stop() (stop_request.h) as a signal
  // would; an exception fails the run.
  std::function<void(const nlohmann::json& record)> on_step;
};

// Runs the whole job (it stops early, saving a checkpoint, once stop_requested() is set: see
// TrainResult::stopped_by): cfg.pp x cfg.dp x cfg.tp ranks as threads of this process (inproc
// backend), or this process's rank of an mpirun job of dp x tp processes (MPI backend, chosen
// automatically under mpirun; another process count is a ConfigError that says what the flags
// need). Rank 0's `log` receives the progress line and messages (nullptr: silent); rank 0's result
// is returned (other MPI ranks return theirs).
TrainResult run_training(const TrainConfig& cfg, std::FILE* log, const TrainHooks& hooks = {});

// The configuration a run of these keys runs, in `tessera train`'s precedence, lowest first: the
// defaults, the saved config of the checkpoint that `resume` names, `file` (a --config file's
// keys), then `given` (the command line's). `resume` is given's, else file's. Unknown keys and
// values of the wrong type are ConfigErrors naming the key (rules between keys wait for
// validate()); the checkpoint's checksums are verified later, when the trainer loads it.
TrainConfig resolve_train_config(const nlohmann::json& file, const nlohmann::json& given);

// Sets the BLAS thread count (0: the cores divided among `ranks_in_process` ranks) and returns
// the count in effect.
int set_compute_threads(int threads, int ranks_in_process = 1);

// Tests: sees the tokens of every micro-batch each rank fetches for training: its world rank, the
// step (counted from 0), the global row of its first sequence in the step's batch, its rows and
// their inputs (rows x seq, row-major). Called from the ranks' threads at once (the observer
// synchronises itself); none by default. Set it before run_training, clear it (nullptr) after.
using BatchObserver = std::function<void(int world_rank, int64_t step, int first_row, int rows,
                                         int seq, const int32_t* inputs)>;
void set_batch_observer(BatchObserver observer);

}  // namespace tessera::train
