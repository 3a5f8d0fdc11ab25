// Internal to the trainer: everything the ranks of a run share, prepared once per process before
// they start (under mpirun rank 0 first, which fills the data cache the others then read): the
// checkpoint to resume, the model's configuration, the data and its split, and the bf16 GEMM path.
#pragma once

#include <cstdio>
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
};

// Reads the checkpoint (--resume) or the weights' config (--init-from), prepares the data, and
// settles the model's configuration; ConfigError when the data, the model and the layout disagree.
// `log` (may be null) gets a line saying what the data is.
RunPlan make_plan(const TrainConfig& cfg, std::FILE* log);

// --bf16-gemm resolved once per process before the ranks start (under mpirun, by rank 0 for all):
// auto measures the two paths (kernels/precision.h), except that a resumed run keeps the path its
// checkpoint ran where this machine has it, so that it continues bitwise.
void choose_bf16_gemm(const TrainConfig& cfg, RunPlan& plan);

}  // namespace tessera::train
