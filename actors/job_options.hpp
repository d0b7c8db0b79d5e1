#pragma once
// How a program starts a job and what it hears back: the options of
// run_job() (runtime/job.hpp), its progress reports and its error. Part of the
// public API (<troupe/troupe.hpp>), so it names nothing of the runtime: the
// plan resolved from these options is actors/job_plan.hpp's.
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace troupe {

struct fault_injection;

// A job that could not start or did not finish; what() says why and where.
class job_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct progress_info {
  std::string unit = "step";  // what `step` counts ("step"; actor_learner: "update")
  int64_t step = 0;           // updates done
  int64_t total_steps = 0;    // 0: the job stops on other grounds (the strategy's)
  double loss = 0;            // mean over the updates since the last report
  double samples_per_second = 0;
  double elapsed_seconds = 0;
  // The strategy's own progress measure as a progress line shows it
  // ("epoch 2/12"; "env steps 120000 (40%)  episodes 310  mean return (100)
  // 187.2"), and the same figures as numbers ("epoch", "env_steps", ...).
  std::string measure;
  nlohmann::json figures = nlohmann::json::object();
};

struct job_options {
  bool resume = false;
  // A fresh run refuses an output whose checkpoint directory already holds
  // checkpoints (they would be mixed with the new run's); overwrite deletes them.
  bool overwrite = false;
  std::string output_dir;  // "" = config's logging.output_dir or runs/<name>
  // Where to write a timeline trace (Chrome trace-event JSON); "" = none.
  std::string trace_path;
  // Called on the coordinator's thread every logging.every_steps steps.
  std::function<void(const progress_info&)> on_progress;
  // Called once per finished epoch with its metrics line.
  std::function<void(const nlohmann::json&)> on_epoch;
  // Test interface (actors/fault_injection.hpp, not installed); null in
  // production.
  std::shared_ptr<const fault_injection> faults;
};

}  // namespace troupe
