#include "viz/plot_curves.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessera/core/error.h"
#include "viz/svg.h"

namespace tessera::viz {
namespace {

// Tableau 10: distinguishable, and readable for the common colour-vision deficiencies.
const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

}  // namespace

std::string curves_svg(const std::vector<Series>& series, const CurvesOptions& o) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  for (const Series& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  TESSERA_CHECK_AS(ConfigError, x_lo <= x_hi, "no points to plot");
  if (x_hi == x_lo) x_hi = x_lo + 1;
  if (y_hi == y_lo) {
    y_lo -= 0.5;
    y_hi += 0.5;
  }
  const double pad = 0.04 * (y_hi - y_lo);
  y_lo -= pad;
  y_hi += pad;
  std::vector<double> xt = nice_ticks(x_lo, x_hi, 8), yt = nice_ticks(y_lo, y_hi, 7);

  double ytick_w = 0;
  for (double t : yt) ytick_w = std::max(ytick_w, text_width(format_number(t), 11));
  const double left = 40 + ytick_w, right = 24, top = 48, bottom = 56;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  auto px = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * pw; };
  auto py = [&](double y) { return top + (y_hi - y) / (y_hi - y_lo) * ph; };

  Svg svg(o.width, o.height);
  if (!o.title.empty()) svg.text(left, 28, o.title, 15, "start", "#111", true);
  svg.rect(left, top, pw, ph, "#fbfbfb", "", "#d0d0d0");
  for (double t : xt) {
    svg.line(px(t), top, px(t), top + ph, "#e2e2e2");
    svg.line(px(t), top + ph, px(t), top + ph + 5, "#444");
    svg.text(px(t), top + ph + 18, format_number(t), 11, "middle", "#333");
  }
  for (double t : yt) {
    svg.line(left, py(t), left + pw, py(t), "#e2e2e2");
    svg.line(left - 5, py(t), left, py(t), "#444");
    svg.text(left - 8, py(t) + 4, format_number(t), 11, "end", "#333");
  }
  svg.line(left, top + ph, left + pw, top + ph, "#444");
  svg.line(left, top, left, top + ph, "#444");
  svg.text(left + pw / 2, o.height - 14, o.x_label, 12, "middle", "#333");
  svg.text(16, top + ph / 2, o.y_label, 12, "middle", "#333", false, -90);

  // Curves, then the legend on top, in the upper right corner.
  double legend_w = 0;
  for (const Series& s : series) legend_w = std::max(legend_w, text_width(s.label, 12));
  for (size_t i = 0; i < series.size(); ++i) {
    const std::string colour = kPalette[i % std::size(kPalette)];
    std::vector<std::pair<double, double>> pts;
    for (const auto& [x, y] : series[i].points)
      if (std::isfinite(x) && std::isfinite(y)) pts.emplace_back(px(x), py(y));
    svg.polyline(pts, colour, 1.8);
    if (pts.size() <= 40)
      for (const auto& [x, y] : pts) svg.circle(x, y, 2.8, colour);
  }
  const double lw = legend_w + 44, lh = 20.0 * static_cast<double>(series.size()) + 10;
  const double lx = left + pw - lw - 10, ly = top + 10;
  svg.rect(lx, ly, lw, lh, "#ffffff", "", "#c8c8c8");
  for (size_t i = 0; i < series.size(); ++i) {
    const std::string colour = kPalette[i % std::size(kPalette)];
    const double y = ly + 15 + 20.0 * static_cast<double>(i);
    svg.line(lx + 8, y, lx + 30, y, colour, 2.5);
    svg.text(lx + 36, y + 4, series[i].label, 12);
  }
  return svg.str();
}

}  // namespace tessera::viz
