#include "report/run_data.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/json_limits.hpp"

namespace troupe::report {
namespace fs = std::filesystem;
namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw report_error(p.string() + ": cannot open");
  std::ostringstream b;
  b << in.rdbuf();
  if (in.bad()) throw report_error(p.string() + ": cannot read");
  return b.str();
}

nlohmann::json parse_document(const std::string& text, const std::string& where) {
  if (json_nesting_depth(text, false) > kMaxJsonDepth)
    throw report_error(where + ": JSON nested more than " + std::to_string(kMaxJsonDepth) +
                       " levels deep");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw report_error(where + ": not JSON (" + e.what() + ")");
  }
}

nlohmann::json read_object(const fs::path& p) {
  auto j = parse_document(read_file(p), p.string());
  if (!j.is_object()) throw report_error(p.string() + ": expected a JSON object");
  return j;
}

std::vector<nlohmann::json> read_metrics(const fs::path& p) {
  const std::string text = read_file(p);
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const std::string where = p.string() + ":" + std::to_string(n);
    auto j = parse_document(line, where);
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
      throw report_error(where + ": expected an object with a string \"type\"");
    out.push_back(std::move(j));
  }
  if (out.empty()) throw report_error(p.string() + ": no metrics lines");
  return out;
}

std::string find_trace(const fs::path& dir, const nlohmann::json& summary) {
  std::error_code ec;
  if (summary.contains("trace") && summary["trace"].is_string()) {
    const fs::path t = summary["trace"].get<std::string>();
    if (fs::exists(t, ec)) return t.string();
    if (t.is_relative() && fs::exists(dir / t, ec)) return (dir / t).string();
    if (fs::exists(dir / t.filename(), ec)) return (dir / t.filename()).string();
    throw report_error((dir / "summary.json").string() + ": the run's trace " + t.string() +
                       " is not there");
  }
  if (fs::exists(dir / "trace.json", ec)) return (dir / "trace.json").string();
  return "";
}

}  // namespace

std::vector<const nlohmann::json*> run_data::lines(const std::string& type) const {
  std::vector<const nlohmann::json*> out;
  for (const auto& m : metrics)
    if (m["type"] == type) out.push_back(&m);
  return out;
}

nlohmann::json load_trace(const std::string& path) {
  auto j = parse_document(read_file(path), path);
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    throw report_error(path + ": expected a trace-event object with a \"traceEvents\" array");
  return j;
}

run_data load_run(const std::string& dir) {
  std::error_code ec;
  const fs::path d = dir;
  if (!fs::is_directory(d, ec)) throw report_error(dir + ": not a run directory");
  if (!fs::exists(d / "metrics.jsonl", ec))
    throw report_error(dir + ": no metrics.jsonl (not a troupe run's output directory?)");
  run_data r;
  r.dir = dir;
  r.metrics = read_metrics(d / "metrics.jsonl");
  if (fs::exists(d / "summary.json", ec)) r.summary = read_object(d / "summary.json");
  if (fs::exists(d / "config.json", ec)) r.config = read_object(d / "config.json");
  r.name = r.config.value("name", r.summary.value("job", std::string{}));
  if (r.name.empty()) r.name = fs::path(dir).lexically_normal().filename().string();
  r.trace_path = find_trace(d, r.summary);
  if (!r.trace_path.empty()) r.trace = load_trace(r.trace_path);
  return r;
}

}  // namespace troupe::report
