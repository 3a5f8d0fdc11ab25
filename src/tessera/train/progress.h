// The live progress line: step, loss, tokens/s, model FLOP/s, ETA. On a terminal it redraws one
// line; otherwise (a log file, CI, a rank under mpirun) it prints a line every `every` steps.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace tessera::train {

struct StepStats {
  int64_t step = 0;  // 1-based number of the step just finished
  int64_t total_steps = 0;
  double loss = 0;
  float lr = 0;
  double grad_norm = 0;
  double step_seconds = 0;
  double tokens_per_s = 0;
  double flops_per_s = 0;
  double mfu = -1;  // model FLOP/s over the job's peak; < 0: not known (not printed)
  double eta_seconds = 0;
  // Mixture of experts (moe = true): the auxiliary losses added to the objective, the busiest
  // expert's share over the mean, the dropped fraction, and each expert's share (mean of layers).
  bool moe = false;
  double moe_aux_loss = 0, moe_z_loss = 0, moe_max_load_ratio = 0, moe_dropped_fraction = 0;
  std::vector<double> moe_load;
  // Stragglers (more than one rank): each world rank's compute and communication-wait
  // milliseconds in the step, and the rank whose compute time over the last few steps is clearly
  // above the others' (-1: none) with its ratio to their median.
  std::vector<double> compute_ms, wait_ms;
  int slowest_rank = -1;
  double slowest_ratio = 0;
};

class ProgressLine {
 public:
  ProgressLine(std::FILE* out, int every);
  void update(const StepStats& s);
  // Prints a full line (validation results, messages) without breaking the redrawn line.
  void message(const std::string& text);
  void finish();

 private:
  std::FILE* out_;
  int every_;
  bool tty_;
  bool line_open_ = false;
};

std::string format_duration(double seconds);  // "1m05s", "2h03m", "12.3s"
std::string format_rate(double per_s);        // "1.23G", "45.6M", "789k"

}  // namespace tessera::train
