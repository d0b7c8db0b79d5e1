// troupe report: the SVG primitives, the trace summary's arithmetic, and a
// report of two real runs (made by the report_runs fixture through the CLI)
// read back: every chart there, one point per metrics line, the values.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "report/html_report.hpp"
#include "report/svg.hpp"
#include "report/trace_summary.hpp"

using nlohmann::json;
using namespace troupe::report;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot open " << path);
  std::ostringstream b;
  b << in.rdbuf();
  return b.str();
}

std::vector<json> metrics_of(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<json> out;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(json::parse(l));
  return out;
}

std::string attribute(const std::string& tag, const std::string& name) {
  const auto at = tag.find(" " + name + "=\"");
  if (at == std::string::npos) return "";
  const auto start = at + name.size() + 3;
  return tag.substr(start, tag.find('"', start) - start);
}

// One chart read back from the page: its axis mapping and its series in data units.
struct chart_read {
  bool found = false;
  std::map<std::string, std::vector<std::pair<double, double>>> series;
};

chart_read read_chart(const std::string& html, const std::string& id) {
  chart_read out;
  const auto at = html.find("id=\"" + id + "\"");
  if (at == std::string::npos) return out;
  out.found = true;
  const auto svg_start = html.rfind("<svg", at);
  const auto svg_end = html.find("</svg>", at);
  const std::string svg_tag = html.substr(svg_start, html.find('>', svg_start) - svg_start);
  const double x0 = std::stod(attribute(svg_tag, "data-x0"));
  const double x1 = std::stod(attribute(svg_tag, "data-x1"));
  const double y0 = std::stod(attribute(svg_tag, "data-y0"));
  const double y1 = std::stod(attribute(svg_tag, "data-y1"));
  std::istringstream plot(attribute(svg_tag, "data-plot"));
  double left = 0, top = 0, width = 0, height = 0;
  plot >> left >> top >> width >> height;
  for (auto p = html.find("<polyline", svg_start); p < svg_end; p = html.find("<polyline", p + 1)) {
    const std::string tag = html.substr(p, html.find("/>", p) - p);
    auto& pts = out.series[attribute(tag, "data-series")];
    std::istringstream in(attribute(tag, "points"));
    std::string xy;
    while (in >> xy) {
      const auto comma = xy.find(',');
      const double px = std::stod(xy.substr(0, comma)), py = std::stod(xy.substr(comma + 1));
      pts.emplace_back(x0 + (px - left) / width * (x1 - x0),
                       y0 + (top + height - py) / height * (y1 - y0));
    }
  }
  return out;
}

// The keys whose values differ between two configs, flattened independently
// of the report's own code.
void flatten(const json& j, const std::string& prefix, std::map<std::string, json>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
  } else {
    out[prefix] = j;
  }
}

}  // namespace

TEST_CASE("nice_ticks cover the range with round steps") {
  CHECK(nice_ticks(0, 0.83, 5) == std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1});
  auto t = nice_ticks(3.2, 5612, 6);
  CHECK(t.front() == 0);
  CHECK(t.back() == 6000);
  CHECK(t.size() == 7);
  t = nice_ticks(-0.37, 0.12, 5);
  CHECK(t.front() <= -0.37);
  CHECK(t.back() >= 0.12);
  CHECK(std::find(t.begin(), t.end(), 0.0) != t.end());  // exactly 0, not 1e-17
  CHECK(tick_label(0) == "0");
  CHECK(tick_label(12000) == "12k");
  CHECK(tick_label(1500000) == "1.5M");
  CHECK(tick_label(0.25) == "0.25");
  CHECK(xml_escape("a<b & \"c\"") == "a&lt;b &amp; &quot;c&quot;");
}

TEST_CASE("a chart maps its points back exactly through its written axes") {
  line_chart c;
  c.id = "t";
  c.lines.push_back({"a", {{0, 1}, {10, 3}, {20, 2}}});
  c.lines.push_back({"b <&>", {{5, -1}}});
  const auto read = read_chart(render(c), "t");
  REQUIRE(read.found);
  REQUIRE(read.series.at("a").size() == 3);
  CHECK(read.series.at("a")[1].first == doctest::Approx(10).epsilon(1e-3));
  CHECK(read.series.at("a")[1].second == doctest::Approx(3).epsilon(1e-3));
  CHECK(read.series.at("b &lt;&amp;&gt;")[0].second == doctest::Approx(-1).epsilon(1e-3));
  line_chart empty;
  empty.id = "e";
  CHECK(render(empty).find("no data") != std::string::npos);
}

TEST_CASE("trace summary: innermost category, untraced rest, all-reduce share") {
  // replica:0: a 100 µs compute step holding a 30 µs all_reduce and, inside
  // that, a 10 µs wait; then a 50 µs wait. device:0: 40 µs compute, 20 µs io.
  const json trace = json::parse(R"({
    "traceEvents": [
      {"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"replica:0"}},
      {"ph":"M","name":"thread_name","pid":1,"tid":2,"args":{"name":"device:0"}},
      {"ph":"X","name":"step","cat":"compute","ts":0,"dur":100,"pid":1,"tid":1},
      {"ph":"X","name":"all_reduce","cat":"communicate","ts":50,"dur":30,"pid":1,"tid":1},
      {"ph":"X","name":"peers","cat":"wait","ts":60,"dur":10,"pid":1,"tid":1},
      {"ph":"X","name":"idle","cat":"wait","ts":100,"dur":50,"pid":1,"tid":1},
      {"ph":"X","name":"forward_backward","cat":"compute","ts":0,"dur":40,"pid":1,"tid":2},
      {"ph":"X","name":"checkpoint","cat":"io","ts":40,"dur":20,"pid":1,"tid":2},
      {"ph":"C","name":"mailbox_depth","pid":1,"tid":1,"ts":5,"args":{"replica:0":3}}
    ],
    "otherData": {"start_us": 0, "end_us": 200}})");
  const auto s = summarize_trace(trace);
  CHECK(s.wall_s == doctest::Approx(200e-6));
  REQUIRE(s.tracks.size() == 2);
  const auto& r = s.tracks[0];
  CHECK(r.track == "replica:0");
  CHECK(r.compute_s == doctest::Approx(70e-6));
  CHECK(r.communicate_s == doctest::Approx(20e-6));
  CHECK(r.wait_s == doctest::Approx(60e-6));
  CHECK(r.untraced_s == doctest::Approx(50e-6));
  const auto& d = s.tracks[1];
  CHECK(d.track == "device:0");
  CHECK(d.compute_s == doctest::Approx(40e-6));
  CHECK(d.io_s == doctest::Approx(20e-6));
  CHECK(s.allreduce_share == doctest::Approx(20.0 / (70 + 20 + 40)));
  CHECK(s.clipped_spans == 0);

  auto bad = trace;
  bad["traceEvents"][4]["dur"] = -3;
  CHECK_THROWS_WITH(summarize_trace(bad), "traceEvents[4].dur: expected a finite number >= 0");
  bad = trace;
  bad["traceEvents"][5]["cat"] = "thinking";
  CHECK_THROWS_WITH(
      summarize_trace(bad),
      R"(traceEvents[5].cat: expected one of "compute", "communicate", "wait", "io", got "thinking")");
  bad = trace;
  bad["traceEvents"][2].erase("tid");
  CHECK_THROWS_WITH(summarize_trace(bad), "traceEvents[2].tid: expected an integer");
  CHECK_THROWS(summarize_trace(json::parse(R"({"events": []})")));
}

TEST_CASE("the config table marks exactly the keys that differ") {
  run_data a, b;
  a.dir = "a";
  b.dir = "b";
  a.name = b.name = "same";
  a.metrics = b.metrics = {json{{"type", "step"}, {"step", 1}, {"loss", 1.0}}};
  a.config = json::parse(R"({"strategy": {"kind": "mirrored", "replicas": 2}, "seed": 1})");
  b.config = json::parse(R"({"strategy": {"kind": "mirrored", "replicas": 4}, "seed": 1,
                             "extra": [1, 2]})");
  const auto html = render_html({a, b});
  std::set<std::string> marked;
  for (auto p = html.find("<tr class=\"diff\""); p != std::string::npos;
       p = html.find("<tr class=\"diff\"", p + 1))
    marked.insert(attribute(html.substr(p, html.find('>', p) - p), "data-key"));
  CHECK(marked == std::set<std::string>{"strategy.replicas", "extra"});
  // Two runs of one job: the legend tells them apart by directory.
  CHECK(html.find("same (a)") != std::string::npos);
  CHECK(html.find("same (b)") != std::string::npos);
}

TEST_CASE("a report of two real runs: every chart, every point, the right values") {
  const std::string dir = TROUPE_REPORT_DIR;
  const std::string html = slurp(dir + "/report.html");
  const std::vector<std::string> runs = {dir + "/report_one_device",
                                         dir + "/report_parameter_server"};
  const std::vector<std::string> names = {"report_one_device", "report_parameter_server"};

  // No script, nothing fetched: the page stands alone.
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("href=\"http") == std::string::npos);

  struct expected_chart {
    const char* id;
    const char* type;
    const char* x;
    const char* y;
  };
  const expected_chart charts[] = {
      {"chart-loss-step", "step", "step", "loss"},
      {"chart-loss-time", "step", "elapsed_seconds", "loss"},
      {"chart-test-accuracy-step", "epoch", "step", "test_accuracy"},
      {"chart-test-accuracy-time", "epoch", "elapsed_seconds", "test_accuracy"},
      {"chart-samples-per-second-step", "step", "step", "samples_per_second"},
      {"chart-samples-per-second-time", "step", "elapsed_seconds", "samples_per_second"},
  };
  for (const auto& c : charts) {
    CAPTURE(c.id);
    const auto read = read_chart(html, c.id);
    REQUIRE(read.found);
    for (std::size_t k = 0; k < runs.size(); ++k) {
      CAPTURE(names[k]);
      std::vector<std::pair<double, double>> want;
      const std::string type = c.type;
      for (const auto& m : metrics_of(runs[k]))
        if (m.value("type", "") == type)
          want.emplace_back(m.at(c.x).get<double>(), m.at(c.y).get<double>());
      REQUIRE(!want.empty());
      REQUIRE(read.series.count(names[k]) == 1);
      const auto& got = read.series.at(names[k]);
      REQUIRE(got.size() == want.size());
      // Points are written to 0.01 px: a tolerance of 1/1000 of the axis range.
      const auto x_range = std::max(1e-9, std::abs(want.back().first - want.front().first));
      double y_lo = want[0].second, y_hi = y_lo;
      for (auto [x, y] : want) y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
      const double y_range = std::max(1e-9, y_hi - y_lo);
      for (std::size_t i = 0; i < want.size(); ++i) {
        CHECK(std::abs(got[i].first - want[i].first) <= 1e-3 * x_range * 2);
        CHECK(std::abs(got[i].second - want[i].second) <= 1e-3 * y_range * 4);
      }
    }
  }
  // RL charts only for RL runs.
  CHECK(!read_chart(html, "chart-mean-return-step").found);

  // The parameter server's staleness: a mean and a max line per shard, one
  // point per epoch, equal to its "shard" lines.
  const auto stale = read_chart(html, "chart-staleness-epoch");
  REQUIRE(stale.found);
  for (int shard = 0; shard < 2; ++shard) {
    const std::string base = "report_parameter_server shard " + std::to_string(shard);
    REQUIRE(stale.series.count(base + " max") == 1);
    std::vector<double> want;
    for (const auto& m : metrics_of(runs[1]))
      if (m["type"] == "shard" && m["shard"] == shard) want.push_back(m["staleness_max"]);
    const auto& got = stale.series.at(base + " max");
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      CHECK(got[i].second == doctest::Approx(want[i]).epsilon(0.01).scale(10));
  }

  // The config rows marked as differing are exactly the keys whose values differ.
  std::map<std::string, json> ca, cb;
  flatten(json::parse(slurp(runs[0] + "/config.json")), "", ca);
  flatten(json::parse(slurp(runs[1] + "/config.json")), "", cb);
  std::set<std::string> differ;
  for (auto& [k, v] : ca)
    if (!cb.count(k) || cb[k] != v) differ.insert(k);
  for (auto& [k, v] : cb)
    if (!ca.count(k)) differ.insert(k);
  REQUIRE(differ.count("strategy.kind") == 1);
  const auto config_at = html.find("<table class=\"config\"");
  REQUIRE(config_at != std::string::npos);
  std::set<std::string> marked;
  for (auto p = html.find("<tr class=\"diff\"", config_at); p != std::string::npos;
       p = html.find("<tr class=\"diff\"", p + 1))
    marked.insert(attribute(html.substr(p, html.find('>', p) - p), "data-key"));
  CHECK(marked == differ);
  // Each run's summary is there, with its accuracy.
  for (const auto& r : runs) {
    const auto summary = json::parse(slurp(r + "/summary.json"));
    std::string cell = ">";
    cell += summary.at("test_accuracy").dump();
    cell += "<";
    CHECK(html.find(cell) != std::string::npos);
  }
}
