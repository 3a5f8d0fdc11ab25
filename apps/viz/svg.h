// A minimal SVG document builder (standard library only). Coordinates are pixels from the top
// left; text is escaped; every shape may carry a tooltip (<title>), which browsers show on hover.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tessera::viz {

class Svg {
 public:
  Svg(double width, double height);
  // `css_class` tags the element (class="..."), so tools and tests can find the data boxes.
  void rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& tooltip = "", const std::string& stroke = "",
            const std::string& css_class = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width = 1,
            const std::string& dash = "");
  void polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                double width = 1.5);
  void circle(double x, double y, double r, const std::string& fill);
  // anchor: "start", "middle" or "end"; rotate: degrees about (x, y).
  void text(double x, double y, const std::string& s, double size = 12,
            const std::string& anchor = "start", const std::string& fill = "#222",
            bool bold = false, double rotate = 0);
  // The complete document.
  std::string str() const;

 private:
  double width_, height_;
  std::string body_;
};

std::string xml_escape(const std::string& s);

// A number written compactly for labels: "0", "0.25", "12", "1.5e+06".
std::string format_number(double x);

// Rough width in pixels of `s` in a sans-serif font of `size` px (for fitting labels).
double text_width(const std::string& s, double size);

// Round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten, about `target`
// of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace tessera::viz
