// `tessera plot`: SVG pictures of a run: the timeline of a `tessera train --trace` file, or loss
// curves from one or more `--metrics` files.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "viz/metrics_series.h"
#include "viz/plot_curves.h"
#include "viz/plot_timeline.h"
#include "viz/trace_timeline.h"

namespace tessera::app {
namespace {

struct PlotFlags {
  std::string trace, out, title, window;
  std::vector<std::string> metrics, labels, keys;
};

// "FROM,TO" in milliseconds; either side may be empty ("100," is from 100 ms to the end).
viz::TraceWindow parse_window(const std::string& text) {
  viz::TraceWindow w;
  if (text.empty()) return w;
  const size_t comma = text.find(',');
  TESSERA_CHECK_AS(ConfigError, comma != std::string::npos, "--window '", text,
                   "' must be FROM,TO in milliseconds, such as 100,250");
  auto number = [&](const std::string& part, double fallback) {
    if (part.empty()) return fallback;
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TESSERA_CHECK_AS(ConfigError, used == part.size() && used > 0 && x >= 0, "--window '", text,
                     "': '", part, "' is not a time in milliseconds");
    return x;
  };
  w.from_ms = number(text.substr(0, comma), 0);
  w.to_ms = number(text.substr(comma + 1), w.to_ms);
  TESSERA_CHECK_AS(ConfigError, w.from_ms < w.to_ms, "--window '", text, "' ends before it starts");
  return w;
}

void plot_trace(const PlotFlags& f) {
  viz::Timeline t = viz::read_trace_timeline(f.trace, parse_window(f.window));
  if (!f.title.empty()) t.title = f.title;
  size_t spans = 0;
  for (const viz::TimelineRow& row : t.rows) spans += row.boxes.size() + row.comm.size();
  io::write_file_atomic(f.out, viz::timeline_svg(t));
  std::printf("wrote %s: %zu ranks, %zu spans, bubble %.1f%%\n", f.out.c_str(), t.rows.size(),
              spans, 100 * viz::overall_bubble(t));
}

void plot_metrics(const PlotFlags& f) {
  TESSERA_CHECK_AS(ConfigError, f.labels.empty() || f.labels.size() == f.metrics.size(),
                   "give one --label per --metrics file (", f.metrics.size(), " files, ",
                   f.labels.size(), " labels), or none");
  const std::vector<std::string> keys = f.keys.empty() ? std::vector<std::string>{"loss"} : f.keys;
  std::vector<viz::Series> series;
  size_t points = 0;
  for (size_t i = 0; i < f.metrics.size(); ++i) {
    const std::string base =
        f.labels.empty() ? std::filesystem::path(f.metrics[i]).stem().string() : f.labels[i];
    for (const std::string& key : keys) {
      const std::string label = keys.size() > 1 ? base + " " + key : base;
      series.push_back(viz::read_metrics_series(f.metrics[i], key, label));
      points += series.back().points.size();
    }
  }
  viz::CurvesOptions o;
  o.title = f.title;
  std::string y;
  for (const std::string& k : keys) y += (y.empty() ? "" : ", ") + k;
  o.y_label = y;
  if (o.title.empty()) o.title = y + " by step";
  io::write_file_atomic(f.out, viz::curves_svg(series, o));
  std::printf("wrote %s: %zu curves, %zu points\n", f.out.c_str(), series.size(), points);
}

}  // namespace

void register_plot(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<PlotFlags>();
  CLI::App* cmd = root.add_subcommand(
      "plot",
      "Draw SVG pictures of a run. Either the timeline of a trace written by `tessera train\n"
      "--trace` (one row per rank, idle gaps visible, bubble in the title):\n"
      "  tessera plot --schedule-trace trace.json --out timeline.svg\n"
      "or curves from metrics files (JSON lines from `tessera train --metrics`), overlaid:\n"
      "  tessera plot --metrics a.jsonl --metrics b.jsonl --label a --label b --key val_loss "
      "--out curves.svg");
  auto* trace = cmd->add_option("--schedule-trace", f->trace,
                                "Chrome trace JSON from `tessera train --trace`")
                    ->check(CLI::ExistingFile);
  auto* metrics = cmd->add_option("--metrics", f->metrics,
                                  "Metrics file (JSON lines); repeat to overlay several runs")
                      ->check(CLI::ExistingFile);
  trace->excludes(metrics);
  cmd->add_option("--window", f->window,
                  "With --schedule-trace: draw only FROM,TO milliseconds after the first event");
  cmd->add_option("--label", f->labels, "Legend label of each --metrics file, in order");
  cmd->add_option("--key", f->keys,
                  "Quantity to plot against step: loss (default), val_loss, or another numeric "
                  "key; repeat to draw several");
  cmd->add_option("--title", f->title, "Title of the picture");
  cmd->add_option("--out", f->out, "SVG file to write")->required();
  cmd->callback([f, trace, metrics, &exit_code]() {
    TESSERA_CHECK_AS(ConfigError, trace->count() + metrics->count() > 0,
                     "tessera plot needs --schedule-trace FILE or --metrics FILE");
    TESSERA_CHECK_AS(ConfigError, trace->count() == 0 || (f->labels.empty() && f->keys.empty()),
                     "--label and --key go with --metrics, not --schedule-trace");
    TESSERA_CHECK_AS(ConfigError, metrics->count() == 0 || f->window.empty(),
                     "--window goes with --schedule-trace, not --metrics");
    if (trace->count() > 0)
      plot_trace(*f);
    else
      plot_metrics(*f);
    exit_code = 0;
  });
}

}  // namespace tessera::app
