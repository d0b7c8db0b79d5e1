#include "report/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace troupe::report {
namespace {

struct plot_area {
  double left = 72, top = 34, width = 0, height = 0;
};

struct axis_range {
  double lo = 0, hi = 1;
};

double nice_step(double span, int max_ticks) {
  const double raw = span / std::max(1, max_ticks);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

// The data range of every point, widened when flat so a constant series still
// gets an axis.
std::pair<axis_range, axis_range> data_ranges(const line_chart& c) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : c.lines)
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  auto widen = [](double& lo, double& hi) {
    if (hi > lo) return;
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.05;
    lo -= pad;
    hi += pad;
  };
  widen(x0, x1);
  widen(y0, y1);
  return {{x0, x1}, {y0, y1}};
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

std::string fmt_data(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double step = nice_step(hi - lo, max_ticks);
  std::vector<double> out;
  const double first = std::floor(lo / step) * step;
  for (int i = 0; i < 1000; ++i) {
    double v = first + i * step;
    if (std::abs(v) < step * 1e-9) v = 0;  // no "-0" or 1e-17 at the origin
    out.push_back(v);
    if (v >= hi - step * 1e-9) break;
  }
  return out;
}

std::string tick_label(double v) {
  char b[32];
  const double a = std::abs(v);
  if (a == 0) return "0";
  if (a >= 1e6)
    std::snprintf(b, sizeof b, "%gM", v / 1e6);
  else if (a >= 1e4)
    std::snprintf(b, sizeof b, "%gk", v / 1e3);
  else
    std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) switch (ch) {
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
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  return out;
}

const char* series_colour(std::size_t k) {
  // Okabe-Ito: distinguishable with the common colour-vision deficiencies.
  static const char* palette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                  "#E69F00", "#56B4E9", "#000000", "#F0E442"};
  return palette[k % (sizeof palette / sizeof palette[0])];
}

std::string render(const line_chart& c) {
  plot_area pa;
  const double legend_h = 18.0 * static_cast<double>((c.lines.size() + 1) / 2);
  pa.width = c.width - pa.left - 20;
  pa.height = c.height - pa.top - 52 - legend_h;
  auto [xr, yr] = data_ranges(c);
  const auto xt = nice_ticks(xr.lo, xr.hi, 6);
  const auto yt = nice_ticks(yr.lo, yr.hi, 5);
  xr = {xt.front(), std::max(xt.back(), xr.hi)};
  yr = {yt.front(), std::max(yt.back(), yr.hi)};
  auto px = [&](double x) { return pa.left + (x - xr.lo) / (xr.hi - xr.lo) * pa.width; };
  auto py = [&](double y) {
    return pa.top + pa.height - (y - yr.lo) / (yr.hi - yr.lo) * pa.height;
  };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"" << xml_escape(c.id)
    << "\" width=\"" << c.width << "\" height=\"" << c.height << "\" viewBox=\"0 0 " << c.width
    << ' ' << c.height << "\" data-x0=\"" << fmt_data(xr.lo) << "\" data-x1=\"" << fmt_data(xr.hi)
    << "\" data-y0=\"" << fmt_data(yr.lo) << "\" data-y1=\"" << fmt_data(yr.hi) << "\" data-plot=\""
    << fmt(pa.left) << ' ' << fmt(pa.top) << ' ' << fmt(pa.width) << ' ' << fmt(pa.height)
    << "\" role=\"img\" aria-label=\"" << xml_escape(c.title) << "\">\n";
  o << "<text class=\"title\" x=\"" << c.width / 2 << "\" y=\"20\" text-anchor=\"middle\">"
    << xml_escape(c.title) << "</text>\n";
  // Grid and tick labels.
  for (double t : yt) {
    const double y = py(t);
    o << "<line class=\"grid\" x1=\"" << fmt(pa.left) << "\" x2=\"" << fmt(pa.left + pa.width)
      << "\" y1=\"" << fmt(y) << "\" y2=\"" << fmt(y) << "\"/><text class=\"tick\" x=\""
      << fmt(pa.left - 6) << "\" y=\"" << fmt(y + 4) << "\" text-anchor=\"end\">" << tick_label(t)
      << "</text>\n";
  }
  for (double t : xt) {
    const double x = px(t);
    o << "<line class=\"grid\" x1=\"" << fmt(x) << "\" x2=\"" << fmt(x) << "\" y1=\"" << fmt(pa.top)
      << "\" y2=\"" << fmt(pa.top + pa.height) << "\"/><text class=\"tick\" x=\"" << fmt(x)
      << "\" y=\"" << fmt(pa.top + pa.height + 16) << "\" text-anchor=\"middle\">" << tick_label(t)
      << "</text>\n";
  }
  o << "<rect class=\"frame\" x=\"" << fmt(pa.left) << "\" y=\"" << fmt(pa.top) << "\" width=\""
    << fmt(pa.width) << "\" height=\"" << fmt(pa.height) << "\"/>\n";
  o << "<text class=\"label\" x=\"" << fmt(pa.left + pa.width / 2) << "\" y=\""
    << fmt(pa.top + pa.height + 34) << "\" text-anchor=\"middle\">" << xml_escape(c.x_label)
    << "</text>\n";
  o << "<text class=\"label\" transform=\"translate(16 " << fmt(pa.top + pa.height / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">" << xml_escape(c.y_label) << "</text>\n";

  auto colour_of = [&](std::size_t k) {
    return series_colour(c.lines[k].colour >= 0 ? static_cast<std::size_t>(c.lines[k].colour) : k);
  };
  bool any = false;
  for (std::size_t k = 0; k < c.lines.size(); ++k) {
    const auto& s = c.lines[k];
    if (s.points.empty()) continue;
    any = true;
    o << "<polyline class=\"series\" data-series=\"" << xml_escape(s.name) << "\" stroke=\""
      << colour_of(k) << '"' << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
    for (std::size_t i = 0; i < s.points.size(); ++i)
      o << (i ? " " : "") << fmt(px(s.points[i].first)) << ',' << fmt(py(s.points[i].second));
    o << "\"/>\n";
    if (s.points.size() <= 60)
      for (auto [x, y] : s.points)
        o << "<circle class=\"dot\" cx=\"" << fmt(px(x)) << "\" cy=\"" << fmt(py(y))
          << "\" r=\"2.5\" fill=\"" << colour_of(k) << "\"/>";
    o << '\n';
  }
  if (!any)
    o << "<text class=\"empty\" x=\"" << fmt(pa.left + pa.width / 2) << "\" y=\""
      << fmt(pa.top + pa.height / 2) << "\" text-anchor=\"middle\">no data</text>\n";
  // Legend: two entries a row under the axis label.
  for (std::size_t k = 0; k < c.lines.size(); ++k) {
    const double lx = pa.left + static_cast<double>(k % 2) * (pa.width / 2);
    const double ly = pa.top + pa.height + 52 + 18.0 * static_cast<double>(k / 2);
    o << "<g class=\"legend\"><line x1=\"" << fmt(lx) << "\" x2=\"" << fmt(lx + 22) << "\" y1=\""
      << fmt(ly - 4) << "\" y2=\"" << fmt(ly - 4) << "\" stroke=\"" << colour_of(k)
      << "\" stroke-width=\"3\"" << (c.lines[k].dashed ? " stroke-dasharray=\"6 4\"" : "")
      << "/><text x=\"" << fmt(lx + 28) << "\" y=\"" << fmt(ly) << "\">"
      << xml_escape(c.lines[k].name) << "</text></g>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace troupe::report
