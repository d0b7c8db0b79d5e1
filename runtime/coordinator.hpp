#pragma once
// coordinator: the lifecycle of a job, whatever its strategy: start (or
// restore, then start), steps issued by the strategy's driver, boundaries
// (epoch end, evaluation, replica check, checkpoint), metrics and progress,
// failure, finish. What a step is and who takes it when is the strategy's
// (strategies/strategy.hpp).
#include <chrono>
#include <fstream>
#include <memory>
#include <vector>

#include "actors/job_plan.hpp"
#include "actors/strategy_api.hpp"
#include "messages/protocols.hpp"
#include "trace/trace.hpp"

namespace troupe {

class job_driver;
class coordinator_host_impl;

struct coordinator_state {
  std::shared_ptr<const job_plan> plan;
  trace::track_id track = trace::no_track;  // timeline trace: evaluation, checkpoints, metrics
  std::vector<replica_actor> replicas;
  shard_set shards;
  std::unique_ptr<coordinator_host_impl> host;
  std::unique_ptr<job_driver> driver;
  // Every other actor of the job, by name: monitored, a failure ends the job.
  std::vector<std::pair<std::string, caf::actor>> others;
  caf::typed_response_promise<std::string> done;
  int64_t issued = 0;     // steps sent to replicas
  int64_t completed = 0;  // steps finished
  int64_t boundary = 0;   // the next step at which to stop and do epoch/checkpoint work
  bool finished = false;
  // Reporting.
  std::ofstream metrics;
  std::chrono::steady_clock::time_point started, window_start;
  double boundary_seconds = 0;  // time spent in evaluation and checkpoints
  double window_loss = 0;
  int64_t window_count = 0;
  int64_t samples = 0;
  nlohmann::json last_eval = nlohmann::json::object();
  std::string last_checkpoint;
  nlohmann::json shard_summary = nlohmann::json::object();  // staleness, for the summary
  coordinator_state();
  ~coordinator_state();
  static inline const char* name = "coordinator";
};

coordinator_actor::behavior_type coordinator(
    coordinator_actor::stateful_pointer<coordinator_state> self,
    std::shared_ptr<const job_plan> plan, std::vector<replica_actor> replicas,
    std::vector<std::pair<std::string, caf::actor>> others, shard_set shards = {});

}  // namespace troupe
