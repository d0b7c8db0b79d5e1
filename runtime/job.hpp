#pragma once
// Running a job in one process: builds the actor topology for the config's
// strategy (runtime/topology.hpp), drives it with the coordinator, and returns
// the summary.
#include <nlohmann/json.hpp>

#include "actors/job_options.hpp"
#include "config/job_config.hpp"

namespace troupe {

// Runs the job; returns the summary (also written to <output>/summary.json).
// Throws job_error (or config_error) with a clear message on failure.
nlohmann::json run_job(const job_config& c, const job_options& o = {});

}  // namespace troupe
