// The run report: one self-contained HTML page (inline CSS and SVG, no
// scripts, nothing fetched) comparing one or more runs.
#pragma once

#include <string>
#include <vector>

#include "report/run_data.hpp"

namespace troupe::report {

// A trace given on its own (`troupe report --trace FILE`), shown beside the runs.
struct named_trace {
  std::string path;
  nlohmann::json trace;
};

// Throws report_error when a trace is malformed (naming the file and event).
std::string render_html(const std::vector<run_data>& runs,
                        const std::vector<named_trace>& traces = {});

// The config flattened to dotted keys ("strategy.reducer.algorithm"), arrays
// kept whole: what the config table compares between runs.
std::vector<std::pair<std::string, nlohmann::json>> flatten_config(const nlohmann::json& j);

}  // namespace troupe::report
