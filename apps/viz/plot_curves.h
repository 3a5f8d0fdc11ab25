// Draws curves (loss against step, typically) as SVG: one coloured line per series, markers on
// sparse series, axes with round ticks and grid lines, axis labels, a title and a legend. Each
// series is a <polyline>; the legend lists the labels in order.
#pragma once

#include <string>
#include <vector>

#include "viz/metrics_series.h"

namespace tessera::viz {

struct CurvesOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label = "loss";
  double width = 900;
  double height = 540;
};

// Throws ConfigError when there is no point to draw.
std::string curves_svg(const std::vector<Series>& series, const CurvesOptions& options);

}  // namespace tessera::viz
