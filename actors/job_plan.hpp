#pragma once
// What a job is before any actor runs: the options it was started with, the
// plan resolved from its config (data, step counts, where to resume), and the
// errors and progress reports it gives. Below the topology builder
// (runtime/topology.hpp), the coordinator and the strategies, so none of them
// includes another upwards.
#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/partitioner.hpp"
#include "checkpoint/checkpoint.hpp"
#include "config/job_config.hpp"
#include "data/dataset.hpp"
#include "messages/protocols.hpp"

namespace troupe {

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
  // Test hook: make replica k throw at step s (both >= 0 to enable).
  int64_t fail_replica = -1;
  int64_t fail_at_step = -1;
  // Test hook (actor_learner): rl_actor fail_replica fails after
  // fail_at_step unrolls; learner k fails at update s.
  int64_t fail_learner = -1;
  int64_t fail_learner_at_update = -1;
  // Test hook (parameter_server): worker k takes no step until s updates are
  // done, then joins as a late worker would.
  int64_t join_replica = -1;
  int64_t join_at_step = -1;
  // Test hook (central_storage, parameter_server): variable shard k fails
  // once s updates are done.
  int64_t fail_shard = -1;
  int64_t fail_shard_at_step = -1;
};

class strategy;

// What the coordinator needs to drive a job, resolved before any actor starts.
struct job_plan {
  job_config config;
  job_options options;
  std::shared_ptr<const strategy> strat;  // strategies/strategy.hpp, by strategy.kind
  std::string output_dir;
  std::string checkpoint_dir;
  std::shared_ptr<const data::dataset> train;
  std::shared_ptr<const data::dataset> test;
  // Updates per epoch (0: the strategy has no epochs) and in the whole job.
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t start_step = 0;
  std::optional<checkpoint::snapshot> resume_from;
  bool owner = true;  // this process writes the job's output (see make_plan)
  // Across processes: the task hosting each replica ("worker:1"), so a
  // failure names it; empty in one process.
  std::vector<std::string> replica_tasks;
  // Every request the coordinator makes (to replicas, shards) fails after
  // this long; troupe node sets it for remote peers, whose pending requests
  // CAF never fails on its own when the peer vanishes.
  caf::duration request_timeout = caf::infinite;
};

// Strategies with variable shards: where the variables live.
struct shard_set {
  std::vector<variable_shard_actor> actors;
  placement place;
  std::vector<std::string> slot_suffixes;  // the optimizer's slot names
};

// Resolved output directory of a job.
std::string output_dir_for(const job_config& c, const job_options& o);

}  // namespace troupe
