// Line charts as inline SVG: the few drawing primitives the run report needs,
// kept in one place so every chart looks and reads the same.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace troupe::report {

struct series {
  std::string name;                               // legend text
  std::vector<std::pair<double, double>> points;  // (x, y), in data units
  bool dashed = false;
  int colour = -1;  // palette index; -1: the series' position in its chart
};

struct line_chart {
  std::string id;       // the <svg>'s id, e.g. "chart-loss-step"
  std::string title;    // above the plot
  std::string x_label;  // with its unit, e.g. "wall time (s)"
  std::string y_label;
  std::vector<series> lines;
  int width = 600;
  int height = 330;
};

// Round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart),
// at most about `max_ticks` of them; the first <= lo, the last >= hi.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks);

// A tick label: short, without trailing zeros ("0.25", "12k", "1.5M", "1e-05").
std::string tick_label(double v);

// Text safe inside XML/HTML content and attribute values.
std::string xml_escape(const std::string& s);

// The colour of the k-th run (colour-blind-safe palette, cycling).
const char* series_colour(std::size_t k);

// The chart as one <svg> element. Every series is a <polyline
// data-series="NAME" points="..."> in pixel coordinates, and the plot's
// mapping is written on the <svg> (data-x0 data-x1 data-y0 data-y1: the axis
// ranges; data-plot="left top width height": the plot area), so a reader
// (and the tests) can map the points back to data units. Series with few
// points also get a dot per point. A chart without points says so.
std::string render(const line_chart& c);

}  // namespace troupe::report
