#include "report/html_report.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "report/svg.hpp"
#include "report/trace_summary.hpp"

namespace troupe::report {
namespace {

// One metric the report can chart: which metrics lines hold it, and where.
struct metric {
  std::string id;  // chart ids are "chart-<id>-step" and "chart-<id>-time"
  std::string title;
  std::string unit_label;  // the y axis
  std::string line_type;   // metrics.jsonl "type"
  std::string field;
};

// Classifier runs log "step" and "epoch" lines; actor_learner runs "train" lines.
const std::vector<metric>& charted_metrics() {
  static const std::vector<metric> m = {
      {"loss", "training loss", "loss (mean over the logging window)", "step", "loss"},
      {"test-accuracy", "test accuracy", "accuracy (fraction correct)", "epoch", "test_accuracy"},
      {"samples-per-second", "training throughput", "samples/s", "step", "samples_per_second"},
      {"rl-loss", "learner loss", "loss", "train", "loss"},
      {"mean-return", "mean episode return", "return (mean of the last 100 episodes)", "train",
       "mean_return_100"},
      {"env-steps-per-second", "environment throughput", "env steps/s", "train",
       "env_steps_per_second"},
  };
  return m;
}

// Several runs of one job get their directory in the legend too.
std::vector<std::string> legend_names(const std::vector<run_data>& runs) {
  std::map<std::string, int> count;
  for (const auto& r : runs) ++count[r.name];
  std::vector<std::string> out;
  for (const auto& r : runs)
    out.push_back(count[r.name] > 1 ? r.name + " (" + r.dir + ")" : r.name);
  return out;
}

series series_of(const run_data& r, const metric& m, const char* x_field, const std::string& name,
                 int colour) {
  series s;
  s.name = name;
  s.colour = colour;
  for (const auto* l : r.lines(m.line_type)) {
    const auto x = l->find(x_field);
    const auto y = l->find(m.field);
    if (x == l->end() || y == l->end() || !x->is_number() || !y->is_number()) continue;
    const double xv = x->get<double>(), yv = y->get<double>();
    if (std::isfinite(xv) && std::isfinite(yv)) s.points.emplace_back(xv, yv);
  }
  return s;
}

std::string metric_charts(const std::vector<run_data>& runs,
                          const std::vector<std::string>& names) {
  std::ostringstream o;
  for (const auto& m : charted_metrics()) {
    for (const auto& [x_field, suffix, x_label] :
         {std::tuple{"step", "step", "step"},
          std::tuple{"elapsed_seconds", "time", "wall time since the start (s)"}}) {
      line_chart c;
      c.id = std::string("chart-") + m.id + "-" + suffix;
      c.title = m.title + (std::string(suffix) == "step" ? " by step" : " by wall time");
      c.x_label = x_label;
      c.y_label = m.unit_label;
      bool any = false;
      // Only the runs that logged this metric: an RL run has no test accuracy.
      for (std::size_t k = 0; k < runs.size(); ++k) {
        auto line = series_of(runs[k], m, x_field, names[k], static_cast<int>(k));
        if (line.points.empty()) continue;
        c.lines.push_back(std::move(line));
        any = true;
      }
      if (any) o << "<figure>" << render(c) << "</figure>\n";
    }
  }
  return o.str();
}

// parameter_server / elastic_average: the shards' staleness, per epoch.
std::string staleness_chart(const std::vector<run_data>& runs,
                            const std::vector<std::string>& names) {
  line_chart c;
  c.id = "chart-staleness-epoch";
  c.title = "staleness of applied pushes (mean solid, max dashed)";
  c.x_label = "epoch";
  c.y_label = "staleness (updates behind)";
  bool any = false;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    std::map<int64_t, std::pair<series, series>> per_shard;
    for (const auto* l : runs[k].lines("shard")) {
      const int64_t shard = l->value("shard", int64_t{0});
      auto& [mean, max] = per_shard[shard];
      const double epoch = l->value("epoch", 0.0) + 1;
      mean.points.emplace_back(epoch, l->value("staleness_mean", 0.0));
      max.points.emplace_back(epoch, l->value("staleness_max", 0.0));
    }
    for (auto& [shard, pair] : per_shard) {
      auto& [mean, max] = pair;
      const std::string base = names[k] + " shard " + std::to_string(shard);
      mean.name = base + " mean";
      max.name = base + " max";
      mean.colour = max.colour = static_cast<int>(k);
      max.dashed = true;
      c.lines.push_back(std::move(mean));
      c.lines.push_back(std::move(max));
      any = true;
    }
  }
  return any ? "<figure>" + render(c) + "</figure>\n" : "";
}

std::string cell(const nlohmann::json& v) {
  if (v.is_null()) return "<span class=\"absent\">—</span>";
  return xml_escape(v.is_string() ? v.get<std::string>() : v.dump());
}

void flatten_into(const nlohmann::json& j, const std::string& prefix,
                  std::vector<std::pair<std::string, nlohmann::json>>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [k, v] : j.items())
      flatten_into(v, prefix.empty() ? k : prefix + "." + k, out);
    return;
  }
  out.emplace_back(prefix, j);
}

// Rows of key -> one value per run; rows whose values differ are marked.
std::string comparison_table(const std::string& css_class,
                             const std::vector<nlohmann::json>& per_run,
                             const std::vector<std::string>& names) {
  std::vector<std::string> keys;
  std::set<std::string> seen;
  std::vector<std::map<std::string, nlohmann::json>> flat(per_run.size());
  for (std::size_t k = 0; k < per_run.size(); ++k)
    for (auto& [key, v] : flatten_config(per_run[k])) {
      if (seen.insert(key).second) keys.push_back(key);
      flat[k][key] = v;
    }
  std::ostringstream o;
  o << "<table class=\"" << css_class << "\"><thead><tr><th>key</th>";
  for (const auto& n : names) o << "<th>" << xml_escape(n) << "</th>";
  o << "</tr></thead><tbody>\n";
  for (const auto& key : keys) {
    std::vector<nlohmann::json> values;
    for (auto& f : flat) values.push_back(f.count(key) ? f[key] : nlohmann::json());
    bool differs = false;
    for (const auto& v : values) differs = differs || v != values.front();
    o << "<tr" << (differs && names.size() > 1 ? " class=\"diff\"" : "") << " data-key=\""
      << xml_escape(key) << "\"><td>" << xml_escape(key) << "</td>";
    for (const auto& v : values) o << "<td>" << cell(v) << "</td>";
    o << "</tr>\n";
  }
  o << "</tbody></table>\n";
  return o.str();
}

std::string seconds_and_share(double s, double wall) {
  char b[64];
  std::snprintf(b, sizeof b, "%.3f s (%.1f%%)", s, wall > 0 ? 100 * s / wall : 0.0);
  return b;
}

std::string trace_section(const std::string& title, const std::string& path,
                          const nlohmann::json& trace) {
  trace_summary t;
  try {
    t = summarize_trace(trace);
  } catch (const std::exception& e) {
    throw report_error(path + ": " + e.what());
  }
  std::ostringstream o;
  char wall[32];
  std::snprintf(wall, sizeof wall, "%.3f s", t.wall_s);
  o << "<section class=\"trace\" data-trace=\"" << xml_escape(path) << "\"><h3>"
    << xml_escape(title) << "</h3>\n<p>Trace <code>" << xml_escape(path) << "</code>: wall time "
    << wall;
  if (!std::isnan(t.allreduce_share)) {
    char b[96];
    std::snprintf(b, sizeof b,
                  "; all-reduce share of step time (replicas and devices): <b>%.1f%%</b>",
                  100 * t.allreduce_share);
    o << b;
  }
  if (t.clipped_spans > 0) o << "; " << t.clipped_spans << " spans cut at their parent's end";
  o << ".</p>\n<table class=\"shares\"><thead><tr><th>track</th><th>compute</th>"
       "<th>communicate</th><th>wait</th><th>io</th><th>untraced</th></tr></thead><tbody>\n";
  for (const auto& s : t.tracks) {
    o << "<tr data-track=\"" << xml_escape(s.track) << "\"><td>" << xml_escape(s.track) << "</td>";
    for (double v : {s.compute_s, s.communicate_s, s.wait_s, s.io_s, s.untraced_s})
      o << "<td>" << seconds_and_share(v, s.wall_s) << "</td>";
    o << "</tr>\n";
  }
  o << "</tbody></table></section>\n";
  return o.str();
}

const char* kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 24px; color: #1a1a1a; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.runs li { margin: 2px 0; } .swatch { display: inline-block; width: 14px; height: 4px;
  vertical-align: middle; margin-right: 6px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; } figure { margin: 0; }
svg.chart { background: #fcfcfc; border: 1px solid #ddd; border-radius: 4px; }
svg.chart .title { font-size: 14px; font-weight: 600; } svg.chart .tick { font-size: 11px; fill: #555; }
svg.chart .label { font-size: 12px; fill: #333; } svg.chart .grid { stroke: #e6e6e6; }
svg.chart .frame { fill: none; stroke: #999; } svg.chart .series { fill: none; stroke-width: 1.8; }
svg.chart .legend text { font-size: 12px; } svg.chart .empty { fill: #999; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } tr.diff td { background: #fff3c4; } tr.diff td:first-child { font-weight: 600; }
.absent { color: #aaa; } code { font-size: 12px; }
)";

}  // namespace

std::vector<std::pair<std::string, nlohmann::json>> flatten_config(const nlohmann::json& j) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  flatten_into(j, "", out);
  return out;
}

std::string render_html(const std::vector<run_data>& runs, const std::vector<named_trace>& traces) {
  const auto names = legend_names(runs);
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
       "<title>troupe report</title>\n<style>"
    << kStyle << "</style></head><body>\n<h1>troupe run report</h1>\n<ul class=\"runs\">\n";
  for (std::size_t k = 0; k < runs.size(); ++k)
    o << "<li><span class=\"swatch\" style=\"background:" << series_colour(k) << "\"></span><b>"
      << xml_escape(names[k]) << "</b>: <code>" << xml_escape(runs[k].dir) << "</code>, strategy "
      << xml_escape(runs[k].summary.value("strategy",
                                          runs[k]
                                              .config.value("strategy", nlohmann::json::object())
                                              .value("kind", std::string("?"))))
      << (runs[k].summary.empty() ? " (no summary.json: the run did not finish)" : "") << "</li>\n";
  o << "</ul>\n<h2>Curves</h2>\n<div class=\"charts\">\n"
    << metric_charts(runs, names) << staleness_chart(runs, names) << "</div>\n";

  std::vector<nlohmann::json> summaries, configs;
  for (const auto& r : runs) {
    summaries.push_back(r.summary);
    configs.push_back(r.config);
  }
  o << "<h2>Summary</h2>\n" << comparison_table("summary", summaries, names);
  o << "<h2>Config</h2>\n";
  if (runs.size() > 1) o << "<p>Rows that differ between the runs are highlighted.</p>\n";
  o << comparison_table("config", configs, names);

  bool any_trace = !traces.empty();
  for (const auto& r : runs) any_trace = any_trace || r.trace.has_value();
  if (any_trace) {
    o << "<h2>Timeline traces</h2>\n<p>Per track, the job's wall time spent computing, "
         "communicating, waiting and writing; untraced is the rest. Open the trace files in "
         "Perfetto or chrome://tracing for the timeline itself.</p>\n";
    for (std::size_t k = 0; k < runs.size(); ++k)
      if (runs[k].trace) o << trace_section(names[k], runs[k].trace_path, *runs[k].trace);
    for (const auto& t : traces) o << trace_section(t.path, t.path, t.trace);
  }
  o << "</body></html>\n";
  return o.str();
}

}  // namespace troupe::report
