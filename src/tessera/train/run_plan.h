// Internal to the trainer: everything the ranks of a run share, prepared once per process before
// they start (under mpirun rank 0 first, which fills the data cache the others then read): the
// checkpoint to resume, the model's configuration, the data and its split, and the bf16 GEMM path.
#pragma once

#include <cstdio>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "tessera/core/trace.h"
#include "tessera/data/dataset.h"
#include "tessera/data/prepare.h"
#include "tessera/io/checkpoint.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/train/train_config.h"

namespace tessera::train {

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
  // MFU's denominator: what one rank's threads can compute (choose_peak), and how it was found;
  // 0 when nothing reports MFU.
  double peak_flops_per_rank = 0;
  std::string peak_source;
  // The caller's per-step hook (TrainHooks::on_step), called by rank 0; empty: none.
  std::function<void(const nlohmann::json& record)> on_step;
};

// Reads the checkpoint (--resume) or the weights' config (--init-from), prepares the data, and
// settles the model's configuration; ConfigError when the data, the model and the layout disagree.
// `log` (may be null) gets a line saying what the data is.
RunPlan make_plan(const TrainConfig& cfg, std::FILE* log);

// --bf16-gemm resolved once per process before the ranks start (under mpirun, by rank 0 for all):
// auto measures the two paths (kernels/precision.h), except that a resumed run keeps the path its
// checkpoint ran where this machine has it, so that it continues bitwise.
void choose_bf16_gemm(const TrainConfig& cfg, RunPlan& plan);

// MFU's peak per rank, once per process before the ranks start (after choose_bf16_gemm, in the
// model's GEMM precision): --peak-gflops when given, otherwise, when `reported` (a progress line
// or a metrics file will show MFU), one core's best GEMM rate in CPU time
// (kernels::measure_core_gemm_peak) times the rank's threads: what the rank's cores could do if
// every thread ran the best GEMM all the time, so MFU stays at most 100% on a busy machine too.
void choose_peak(const TrainConfig& cfg, RunPlan& plan, bool reported);

}  // namespace tessera::train
