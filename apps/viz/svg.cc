#include "viz/svg.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace tessera::viz {

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\n' || c == '\t') out += c;
    }
  }
  return out;
}

std::string format_number(double x) {
  if (std::fabs(x) < 1e-12) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

double text_width(const std::string& s, double size) {
  return 0.58 * size * static_cast<double>(s.size());
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  target = std::max(target, 2);
  const double power = std::pow(10.0, std::floor(std::log10((hi - lo) / target)));
  // The step of 1, 2, 5 or 10 times `power` whose tick count is nearest the target (ties: the
  // larger step).
  double step = power;
  double best = std::numeric_limits<double>::infinity();
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    const double st = m * power;
    const double n = std::floor(hi / st + 1e-9) - std::ceil(lo / st - 1e-9) + 1;
    if (std::fabs(n - target) <= best) {
      best = std::fabs(n - target);
      step = st;
    }
  }
  std::vector<double> ticks;
  const double first = std::ceil(lo / step - 1e-9);
  for (double k = first; k * step <= hi + step * 1e-9; k += 1) {
    const double t = k * step;
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

namespace {
std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

// Appends ` name="value"` (values are escaped).
void attr(std::string& out, const char* name, const std::string& value) {
  out += ' ';
  out += name;
  out += "=\"";
  out += xml_escape(value);
  out += '"';
}
void attr(std::string& out, const char* name, double value) {
  attr(out, name, num(value));
}

// Closes an element's start tag: self-closing, or with a <title> child when there is a tooltip.
void close(std::string& out, const char* element, const std::string& tooltip) {
  if (tooltip.empty()) {
    out += "/>\n";
    return;
  }
  out += "><title>";
  out += xml_escape(tooltip);
  out += "</title></";
  out += element;
  out += ">\n";
}
}  // namespace

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& tooltip, const std::string& stroke,
               const std::string& css_class) {
  body_ += "<rect";
  if (!css_class.empty()) attr(body_, "class", css_class);
  attr(body_, "x", x);
  attr(body_, "y", y);
  attr(body_, "width", w);
  attr(body_, "height", h);
  attr(body_, "fill", fill);
  if (!stroke.empty()) {
    attr(body_, "stroke", stroke);
    attr(body_, "stroke-width", 0.6);
  }
  close(body_, "rect", tooltip);
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke, double width,
               const std::string& dash) {
  body_ += "<line";
  attr(body_, "x1", x1);
  attr(body_, "y1", y1);
  attr(body_, "x2", x2);
  attr(body_, "y2", y2);
  attr(body_, "stroke", stroke);
  attr(body_, "stroke-width", width);
  if (!dash.empty()) attr(body_, "stroke-dasharray", dash);
  body_ += "/>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                   double width) {
  std::string pts;
  for (const auto& [x, y] : points) {
    if (!pts.empty()) pts += ' ';
    pts += num(x);
    pts += ',';
    pts += num(y);
  }
  body_ += "<polyline";
  attr(body_, "fill", "none");
  attr(body_, "stroke", stroke);
  attr(body_, "stroke-width", width);
  attr(body_, "stroke-linejoin", "round");
  attr(body_, "points", pts);
  body_ += "/>\n";
}

void Svg::circle(double x, double y, double r, const std::string& fill) {
  body_ += "<circle";
  attr(body_, "cx", x);
  attr(body_, "cy", y);
  attr(body_, "r", r);
  attr(body_, "fill", fill);
  body_ += "/>\n";
}

void Svg::text(double x, double y, const std::string& s, double size, const std::string& anchor,
               const std::string& fill, bool bold, double rotate) {
  body_ += "<text";
  attr(body_, "x", x);
  attr(body_, "y", y);
  attr(body_, "font-size", size);
  attr(body_, "text-anchor", anchor);
  attr(body_, "fill", fill);
  if (bold) attr(body_, "font-weight", "bold");
  if (rotate != 0) {
    std::string t = "rotate(";
    t += num(rotate);
    t += ' ';
    t += num(x);
    t += ' ';
    t += num(y);
    t += ')';
    attr(body_, "transform", t);
  }
  body_ += '>';
  body_ += xml_escape(s);
  body_ += "</text>\n";
}

std::string Svg::str() const {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg";
  attr(out, "xmlns", "http://www.w3.org/2000/svg");
  attr(out, "width", width_);
  attr(out, "height", height_);
  std::string box = "0 0 ";
  box += num(width_);
  box += ' ';
  box += num(height_);
  attr(out, "viewBox", box);
  attr(out, "font-family", "DejaVu Sans, Helvetica, Arial, sans-serif");
  out += ">\n<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  out += body_;
  out += "</svg>\n";
  return out;
}

}  // namespace tessera::viz
