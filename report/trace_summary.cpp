#include "report/trace_summary.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

namespace troupe::report {
namespace {

enum class category { compute, communicate, wait, io };

struct span {
  double ts = 0, end = 0;
  category cat = category::compute;
  double exclusive = 0;  // dur minus what its direct children cover
};

struct track_spans {
  int64_t pid = 0, tid = 0;
  std::vector<span> spans;
};

[[noreturn]] void malformed(std::size_t i, const std::string& field, const std::string& want) {
  throw std::runtime_error("traceEvents[" + std::to_string(i) + "]" +
                           (field.empty() ? "" : "." + field) + ": expected " + want);
}

double number_field(const nlohmann::json& e, std::size_t i, const char* key, double min) {
  if (!e.contains(key) || !e[key].is_number()) malformed(i, key, "a number");
  const double v = e[key].get<double>();
  if (!std::isfinite(v) || v < min)
    malformed(i, key, "a finite number >= " + std::to_string(static_cast<int64_t>(min)));
  return v;
}

int64_t id_field(const nlohmann::json& e, std::size_t i, const char* key) {
  if (!e.contains(key) || !e[key].is_number_integer()) malformed(i, key, "an integer");
  return e[key].get<int64_t>();
}

category category_of(const nlohmann::json& e, std::size_t i) {
  static const std::map<std::string, category> known = {{"compute", category::compute},
                                                        {"communicate", category::communicate},
                                                        {"wait", category::wait},
                                                        {"io", category::io}};
  if (!e.contains("cat") || !e["cat"].is_string())
    malformed(i, "cat", "one of \"compute\", \"communicate\", \"wait\", \"io\"");
  auto it = known.find(e["cat"].get<std::string>());
  if (it == known.end())
    malformed(i, "cat",
              "one of \"compute\", \"communicate\", \"wait\", \"io\", got \"" +
                  e["cat"].get<std::string>() + "\"");
  return it->second;
}

// Exclusive time per span: children are the spans that start inside a span;
// one running past its parent's end is cut there (and counted).
int64_t attribute_exclusive(std::vector<span>& spans) {
  std::sort(spans.begin(), spans.end(), [](const span& a, const span& b) {
    return a.ts != b.ts ? a.ts < b.ts : a.end > b.end;
  });
  int64_t clipped = 0;
  std::vector<span*> open;
  for (auto& s : spans) {
    while (!open.empty() && open.back()->end <= s.ts) open.pop_back();
    s.exclusive = s.end - s.ts;
    if (!open.empty()) {
      span& parent = *open.back();
      if (s.end > parent.end) {
        s.end = parent.end;
        s.exclusive = s.end - s.ts;
        ++clipped;
      }
      parent.exclusive -= s.exclusive;
    }
    open.push_back(&s);
  }
  return clipped;
}

}  // namespace

trace_summary summarize_trace(const nlohmann::json& trace) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    throw std::runtime_error("trace: expected an object with a \"traceEvents\" array");
  const auto& events = trace["traceEvents"];
  std::map<std::pair<int64_t, int64_t>, std::string> names;
  std::vector<track_spans> tracks;
  std::map<std::pair<int64_t, int64_t>, std::size_t> index_of;
  double first = std::numeric_limits<double>::infinity(), last = -first;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    if (!e.is_object()) malformed(i, "", "an object");
    if (!e.contains("ph") || !e["ph"].is_string()) malformed(i, "ph", "a string");
    const auto ph = e["ph"].get<std::string>();
    if (ph == "M") {
      if (e.value("name", "") == "thread_name" && e.contains("args") &&
          e["args"].contains("name") && e["args"]["name"].is_string())
        names[{id_field(e, i, "pid"), id_field(e, i, "tid")}] = e["args"]["name"];
      continue;
    }
    const double ts = number_field(e, i, "ts", -1e18);
    first = std::min(first, ts);
    last = std::max(last, ts);
    if (ph != "X") continue;
    const double dur = number_field(e, i, "dur", 0);
    const auto key = std::make_pair(id_field(e, i, "pid"), id_field(e, i, "tid"));
    auto [it, fresh] = index_of.try_emplace(key, tracks.size());
    if (fresh) tracks.push_back({key.first, key.second, {}});
    tracks[it->second].spans.push_back({ts, ts + dur, category_of(e, i), 0});
    last = std::max(last, ts + dur);
  }

  trace_summary out;
  const auto& other = trace.value("otherData", nlohmann::json::object());
  if (other.is_object() && other.contains("start_us") && other["start_us"].is_number() &&
      other.contains("end_us") && other["end_us"].is_number())
    out.wall_s = (other["end_us"].get<double>() - other["start_us"].get<double>()) / 1e6;
  else if (last > first)
    out.wall_s = (last - first) / 1e6;
  double step_compute = 0, step_communicate = 0;
  for (auto& t : tracks) {
    out.clipped_spans += attribute_exclusive(t.spans);
    track_summary s;
    s.pid = t.pid;
    s.tid = t.tid;
    auto n = names.find({t.pid, t.tid});
    s.track = n != names.end() ? n->second : std::to_string(t.pid) + ":" + std::to_string(t.tid);
    for (const auto& sp : t.spans) {
      const double sec = std::max(0.0, sp.exclusive) / 1e6;
      switch (sp.cat) {
        case category::compute:
          s.compute_s += sec;
          break;
        case category::communicate:
          s.communicate_s += sec;
          break;
        case category::wait:
          s.wait_s += sec;
          break;
        case category::io:
          s.io_s += sec;
          break;
      }
    }
    s.wall_s = out.wall_s;
    s.untraced_s = std::max(0.0, s.wall_s - (s.compute_s + s.communicate_s + s.wait_s + s.io_s));
    if (s.track.starts_with("replica:") || s.track.starts_with("device:")) {
      step_compute += s.compute_s;
      step_communicate += s.communicate_s;
    }
    out.tracks.push_back(std::move(s));
  }
  out.allreduce_share = step_compute + step_communicate > 0
                            ? step_communicate / (step_compute + step_communicate)
                            : std::numeric_limits<double>::quiet_NaN();
  return out;
}

}  // namespace troupe::report
