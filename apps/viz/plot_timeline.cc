#include "viz/plot_timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "viz/svg.h"

namespace tessera::viz {
namespace {

struct Rgb {
  int r, g, b;
};

Rgb base_colour(BoxKind k) {
  switch (k) {
    case BoxKind::Forward:
      return {76, 120, 168};
    case BoxKind::Backward:
      return {84, 162, 75};
    case BoxKind::BackwardInput:
      return {47, 151, 145};
    case BoxKind::BackwardWeight:
      return {178, 121, 162};
    case BoxKind::Comm:
      return {228, 87, 86};
    case BoxKind::Other:
      return {150, 150, 150};
  }
  return {150, 150, 150};
}

const char* kind_name(BoxKind k) {
  switch (k) {
    case BoxKind::Forward:
      return "F forward";
    case BoxKind::Backward:
      return "B backward";
    case BoxKind::BackwardInput:
      return "BI input gradient";
    case BoxKind::BackwardWeight:
      return "W weight gradient";
    case BoxKind::Comm:
      return "communication";
    case BoxKind::Other:
      return "other";
  }
  return "?";
}

// Chunk 0 is the base colour lightened; the last chunk the base colour.
Rgb shaded(BoxKind k, int shade, int shades) {
  const Rgb c = base_colour(k);
  if (shades <= 1) return c;
  const double white =
      0.45 * (1.0 - static_cast<double>(std::clamp(shade, 0, shades - 1)) / (shades - 1));
  auto mix = [&](int x) { return static_cast<int>(std::lround(x + (255 - x) * white)); };
  return {mix(c.r), mix(c.g), mix(c.b)};
}

std::string hex(Rgb c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

std::string text_colour_on(Rgb c) {
  const double luminance = 0.299 * c.r + 0.587 * c.g + 0.114 * c.b;
  return luminance > 150 ? "#1a1a1a" : "#ffffff";
}

}  // namespace

std::string timeline_svg(const Timeline& t) {
  // Extent and the smallest box, over every row.
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, min_box = lo;
  bool kinds[6] = {false, false, false, false, false, false};
  bool any_comm = false;
  for (const TimelineRow& row : t.rows) {
    for (const TimelineBox& b : row.boxes) {
      lo = std::min(lo, b.start);
      hi = std::max(hi, b.end);
      if (b.end > b.start) min_box = std::min(min_box, b.end - b.start);
      kinds[static_cast<int>(b.kind)] = true;
    }
    for (const TimelineBox& b : row.comm) {
      lo = std::min(lo, b.start);
      hi = std::max(hi, b.end);
      any_comm = true;
    }
  }
  if (!(lo <= hi)) lo = hi = 0;
  if (t.time_unit.empty()) lo = std::min(lo, 0.0);  // a simulated step starts at 0
  const double span = std::max(hi - lo, 1e-9);

  // Layout. A simulated schedule gets at least 26 px for its shortest box (up to 2400 px).
  double label_w = 60;
  for (const TimelineRow& row : t.rows) label_w = std::max(label_w, text_width(row.name, 13) + 16);
  double plot_w = 1200;
  if (t.time_unit.empty() && std::isfinite(min_box))
    plot_w = std::clamp(span * std::max(900.0 / span, 26.0 / min_box), 600.0, 2400.0);
  const double left = label_w, right_margin = 96, top = 74;
  const double box_h = 24, comm_h = any_comm ? 6 : 0, row_gap = 10;
  const double row_h = box_h + comm_h;
  const double plot_h = static_cast<double>(t.rows.size()) * (row_h + row_gap);
  const double width = left + plot_w + right_margin;
  const double height = top + plot_h + 52;
  auto x_of = [&](double time) { return left + (time - lo) / span * plot_w; };

  Svg svg(width, height);
  svg.text(left, 24, t.title, 15, "start", "#111", true);

  // Legend: one swatch per kind present (per chunk with interleaving).
  double lx = left, ly = 42;
  for (int k = 0; k < 6; ++k) {
    const bool present = k == static_cast<int>(BoxKind::Comm) ? any_comm : kinds[k];
    if (!present) continue;
    const BoxKind kind = static_cast<BoxKind>(k);
    const int n = kind == BoxKind::Comm || kind == BoxKind::Other ? 1 : t.shades;
    for (int c = 0; c < n; ++c) {
      std::string name = kind_name(kind);
      if (n > 1) name += ", chunk " + std::to_string(c);
      svg.rect(lx, ly, 14, 12, hex(shaded(kind, c, n)));
      svg.text(lx + 18, ly + 10.5, name, 11.5);
      lx += 18 + text_width(name, 11.5) + 16;
    }
  }
  svg.rect(lx, ly, 14, 12, "#ececec", "", "#c8c8c8");
  svg.text(lx + 18, ly + 10.5, "idle", 11.5);

  // Grid lines at the time ticks, under the rows.
  const double axis_y = top + plot_h + 2;
  const std::vector<double> ticks = nice_ticks(lo, hi, std::max(4, static_cast<int>(plot_w / 90)));
  for (double tick : ticks)
    svg.line(x_of(tick), top - 4, x_of(tick), axis_y, "#c4c4c4", 0.6, "2,3");

  // Rows.
  const std::vector<double> bubbles = row_bubbles(t);
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const TimelineRow& row = t.rows[i];
    const double y = top + static_cast<double>(i) * (row_h + row_gap);
    svg.text(left - 8, y + box_h / 2 + 4.5, row.name, 13, "end");
    svg.rect(left, y, plot_w, box_h, "#ececec");
    for (const TimelineBox& b : row.boxes) {
      const double x0 = x_of(b.start), w = std::max(x_of(b.end) - x0, 0.5);
      const Rgb c = shaded(b.kind, b.shade, t.shades);
      // A white edge separates neighbours; on a sliver it would hide the colour.
      svg.rect(x0, y, w, box_h, hex(c), b.tooltip, w >= 4 ? "#ffffff" : "", "box");
      const double size = 11;
      if (!b.label.empty() && text_width(b.label, size) + 4 <= w)
        svg.text(x0 + w / 2, y + box_h / 2 + 4, b.label, size, "middle", text_colour_on(c));
    }
    for (const TimelineBox& b : row.comm) {
      const double x0 = x_of(b.start), w = std::max(x_of(b.end) - x0, 0.5);
      svg.rect(x0, y + box_h + 1, w, comm_h - 1, hex(base_colour(BoxKind::Comm)), b.tooltip, "",
               "comm");
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%% idle", 100 * bubbles[i]);
    svg.text(left + plot_w + 8, y + box_h / 2 + 4.5, buf, 12, "start", "#444");
  }

  // Time axis.
  svg.line(left, axis_y, left + plot_w, axis_y, "#444");
  for (double tick : ticks) {
    const double x = x_of(tick);
    svg.line(x, axis_y, x, axis_y + 5, "#444");
    svg.text(x, axis_y + 18, format_number(tick), 11, "middle", "#333");
  }
  svg.text(left + plot_w / 2, axis_y + 38,
           t.time_unit.empty() ? "time (cost units)" : "time (" + t.time_unit + ")", 12, "middle",
           "#333");
  return svg.str();
}

}  // namespace tessera::viz
