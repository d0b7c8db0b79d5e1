#pragma once
// Running a job: builds the actor topology for the config's strategy, drives it
// with the coordinator, and returns the summary.
#include <functional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "config/job_config.hpp"

namespace troupe {

// A job that could not start or did not finish; what() says why and where.
class job_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct progress_info {
  int64_t step = 0;  // steps done
  int64_t total_steps = 0;
  int64_t epoch = 0;  // 0-based epoch of the last step
  int64_t epochs = 0;
  double loss = 0;  // mean over the steps since the last report
  double samples_per_second = 0;
  double elapsed_seconds = 0;
};

struct job_options {
  bool resume = false;
  // A fresh run refuses an output whose checkpoint directory already holds
  // checkpoints (they would be mixed with the new run's); overwrite deletes them.
  bool overwrite = false;
  std::string output_dir;  // "" = config's logging.output_dir or runs/<name>
  // Called on the coordinator's thread every logging.every_steps steps.
  std::function<void(const progress_info&)> on_progress;
  // Called once per finished epoch with its metrics line.
  std::function<void(const nlohmann::json&)> on_epoch;
  // Test hook: make replica k throw at step s (both >= 0 to enable).
  int64_t fail_replica = -1;
  int64_t fail_at_step = -1;
  // Test hook (parameter_server): worker k takes no step until s updates are
  // done, then joins as a late worker would.
  int64_t join_replica = -1;
  int64_t join_at_step = -1;
  // Test hook (central_storage, parameter_server): variable shard k fails
  // once s updates are done.
  int64_t fail_shard = -1;
  int64_t fail_shard_at_step = -1;
};

// Resolved output directory of a job.
std::string output_dir_for(const job_config& c, const job_options& o);

// Runs the job; returns the summary (also written to <output>/summary.json).
// Throws job_error (or config_error) with a clear message on failure.
nlohmann::json run_job(const job_config& c, const job_options& o = {});

}  // namespace troupe
