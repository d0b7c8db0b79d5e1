#pragma once
// The timeline trace of a job's process (`troupe run`, `troupe node`):
// internal, not installed.
#include <optional>

#include <nlohmann/json.hpp>

#include "actors/job_options.hpp"
#include "config/job_config.hpp"
#include "trace/trace.hpp"

namespace troupe {

// With o.trace_path: opens the trace session (a job_error naming the path
// when it cannot be written), and finishes it, adding "trace" to the summary.
void start_trace(std::optional<trace::session>& tracing, const job_config& c, const job_options& o);
void finish_trace(std::optional<trace::session>& tracing, nlohmann::json& summary);

}  // namespace troupe
