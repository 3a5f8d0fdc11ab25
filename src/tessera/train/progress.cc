#include "tessera/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "tessera/comm/launch.h"

namespace tessera::train {

// Under mpirun a rank's output is a pseudo-terminal of Open MPI's whatever mpirun writes to, as
// often a log file as a terminal: there the redrawn line would be every step on one line of the
// log, so ranks launched by mpirun print lines.
ProgressLine::ProgressLine(std::FILE* out, int every)
    : out_(out),
      every_(every < 1 ? 1 : every),
      tty_(isatty(fileno(out)) != 0 && !comm::launched_by_mpi()) {}

void ProgressLine::update(const StepStats& s) {
  char buf[1024];
  int len =
      std::snprintf(buf, sizeof buf,
                    "step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %s tok/s | %sFLOP/s | "
                    "%.0f ms/step | eta %s",
                    static_cast<long long>(s.step), static_cast<long long>(s.total_steps), s.loss,
                    static_cast<double>(s.lr), s.grad_norm, format_rate(s.tokens_per_s).c_str(),
                    format_rate(s.flops_per_s).c_str(), s.step_seconds * 1e3,
                    format_duration(s.eta_seconds).c_str());
  if (s.mfu >= 0)
    len += std::snprintf(buf + len, sizeof buf - static_cast<size_t>(len), " | MFU %.1f%%",
                         100 * s.mfu);
  if (s.compute_ms.size() > 1) {  // " | compute ms 12 14 | wait ms 3 1 | slowest rank 1 (1.6x)"
    auto list = [&](const char* what, const std::vector<double>& v) {
      len += std::snprintf(buf + len, sizeof buf - static_cast<size_t>(len), " | %s ms", what);
      for (size_t i = 0; i < v.size(); ++i) {
        if (len >= static_cast<int>(sizeof buf) - 80) break;
        if (i == 8 && v.size() > 9) {  // many ranks: the largest only
          len += std::snprintf(buf + len, sizeof buf - static_cast<size_t>(len), " .. max %.0f",
                               *std::max_element(v.begin(), v.end()));
          break;
        }
        len += std::snprintf(buf + len, sizeof buf - static_cast<size_t>(len), " %.0f", v[i]);
      }
    };
    list("compute", s.compute_ms);
    list("wait", s.wait_ms);
    if (s.slowest_rank >= 0)
      len += std::snprintf(buf + len, sizeof buf - static_cast<size_t>(len),
                           " | slowest rank %d (%.1fx)", s.slowest_rank, s.slowest_ratio);
  }
  if (s.moe) {  // " | moe aux 0.0101 z 0.0021 | load % 13 12 ... max/mean 1.05 | drop 0.0%"
    len += std::snprintf(buf + len, sizeof buf - static_cast<size_t>(len),
                         " | moe aux %.4f z %.4f | load %%", s.moe_aux_loss, s.moe_z_loss);
    for (double l : s.moe_load)
      if (len < static_cast<int>(sizeof buf) - 64)
        len += std::snprintf(buf + len, sizeof buf - static_cast<size_t>(len), " %.0f", 100 * l);
    std::snprintf(buf + len, sizeof buf - static_cast<size_t>(len), " max/mean %.2f | drop %.1f%%",
                  s.moe_max_load_ratio, 100 * s.moe_dropped_fraction);
  }
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", buf);
    line_open_ = true;
    if (s.step == s.total_steps) finish();
  } else if (s.step % every_ == 0 || s.step == 1 || s.step == s.total_steps) {
    std::fprintf(out_, "%s\n", buf);
  }
  std::fflush(out_);
}

void ProgressLine::message(const std::string& text) {
  if (line_open_) std::fprintf(out_, "\r\033[K");
  std::fprintf(out_, "%s\n", text.c_str());
  line_open_ = false;
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (line_open_) std::fprintf(out_, "\n");
  line_open_ = false;
  std::fflush(out_);
}

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600,
                  (static_cast<int>(s) % 3600) / 60);
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  if (v >= 1e12)
    std::snprintf(buf, sizeof buf, "%.2fT", v / 1e12);
  else if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

}  // namespace tessera::train
