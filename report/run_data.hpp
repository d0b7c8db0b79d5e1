// What a finished (or failed) run left in its output directory, read for the
// report: metrics.jsonl, summary.json, config.json and, when there is one,
// the timeline trace.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::report {

// Bad report input: the message names the file and, where it applies, the
// line ("runs/x/metrics.jsonl:17: not JSON (...)").
struct report_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct run_data {
  std::string dir;
  std::string name;                                   // the job's name, else the directory's
  nlohmann::json config = nlohmann::json::object();   // {} when config.json is missing
  nlohmann::json summary = nlohmann::json::object();  // {} when the run left none (it failed)
  std::vector<nlohmann::json> metrics;                // every line of metrics.jsonl, in order
  std::string trace_path;                             // "" = not traced
  std::optional<nlohmann::json> trace;                // loaded when trace_path is set

  // The metrics lines of one "type", in order.
  std::vector<const nlohmann::json*> lines(const std::string& type) const;
};

// Reads RUN_DIR. metrics.jsonl is required (a run that never logged has
// nothing to show); config.json and summary.json are optional. The trace is
// summary.json's "trace" path (relative paths are taken from the working
// directory, as the run wrote them, then from RUN_DIR), else RUN_DIR/trace.json.
run_data load_run(const std::string& dir);

// A Chrome trace-event JSON file (object form with "traceEvents").
nlohmann::json load_trace(const std::string& path);

}  // namespace troupe::report
