#pragma once
// Running a job in one process: builds the actor topology for the config's
// strategy (runtime/topology.hpp), drives it with the coordinator, and returns
// the summary.
#include <optional>

#include <nlohmann/json.hpp>

#include "actors/job_options.hpp"
#include "config/job_config.hpp"

namespace troupe {

// Runs the job; returns the summary (also written to <output>/summary.json).
// Throws job_error (or config_error) with a clear message on failure.
nlohmann::json run_job(const job_config& c, const job_options& o = {});

namespace trace {
class session;
}
// With o.trace_path: opens the trace session (a job_error naming the path
// when it cannot be written), and finishes it, adding "trace" to the summary.
void start_trace(std::optional<trace::session>& tracing, const job_config& c, const job_options& o);
void finish_trace(std::optional<trace::session>& tracing, nlohmann::json& summary);

}  // namespace troupe
