#pragma once
// coordinator: the lifecycle of every job, whatever its strategy (design
// note "The one coordinator"): start (or restore, then start), work issued
// or heard by the strategy's driver, boundaries (epoch end, evaluation,
// replica check, checkpoint), metrics and progress, failure, the stop and
// the summary. What an update is, who makes it when, the progress measure
// and the stop criterion are the strategy's (actors/strategy_api.hpp).
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/failure.hpp"
#include "actors/job_plan.hpp"
#include "actors/strategy_api.hpp"
#include "messages/coordinator_messages.hpp"
#include "monitoring/metrics_sink.hpp"
#include "strategies/strategy.hpp"
#include "trace/trace.hpp"

namespace troupe {

class coordinator_host_impl;

// The actors a coordinator drives, handed over before `run`: the coordinator
// is spawned first, as the actors of a strategy with its own job report to it.
struct job_parts {
  std::vector<replica_actor> replicas;  // by index
  shard_set shards;
  // Every other actor of the job, by name: watched, a loss ends the job
  // unless the driver takes it (job_driver::actor_lost).
  std::vector<std::pair<std::string, caf::actor>> others;
  // A strategy with a job of its own: the chief's hub and the workers by
  // index; the hub makes the driver.
  std::shared_ptr<job_hub> hub;
  std::vector<std::pair<int64_t, caf::actor>> workers;
};

struct coordinator_state {
  // The lifecycle, one state at a time: a message that belongs to another
  // state (a report after the stop) is ignored by the state it meets.
  enum class phase { waiting, restoring, running, at_boundary, stopping, finished };
  phase now = phase::waiting;
  std::shared_ptr<const job_plan> plan;
  std::shared_ptr<job_parts> parts;
  trace::track_id track = trace::no_track;  // timeline trace: evaluation, checkpoints, metrics
  std::unique_ptr<coordinator_host_impl> host;
  std::unique_ptr<job_driver> driver;
  caf::typed_response_promise<std::string> done;
  int64_t issued = 0;     // steps sent to replicas
  int64_t completed = 0;  // updates finished
  int64_t boundary = 0;   // the next update at which to stop and do epoch/checkpoint work
  std::string stop_reason;
  std::string preempted;  // the signal that asked the job to leave; "" = none
  // A stopping job's last boundary waits for the steps still in flight, so
  // its checkpoint holds the state of the step it names.
  std::function<void()> when_drained;
  // Reporting.
  monitoring::metrics_fanout metrics;  // metrics.jsonl and the plan's metrics_sink
  std::chrono::steady_clock::time_point started, window_start;
  double first_step_seconds = -1;  // from started to the first update's end (summary.json)
  // When the boundary under way began: the epoch line's train_seconds end there.
  std::chrono::steady_clock::time_point boundary_started;
  double boundary_seconds = 0;  // time spent in evaluation and checkpoints
  double window_loss = 0;
  int64_t window_count = 0;
  int64_t samples = 0;
  nlohmann::json last_eval = nlohmann::json::object();
  std::string last_checkpoint;
  int64_t last_checkpoint_step = -1;
  nlohmann::json summary_extras = nlohmann::json::object();  // staleness, for the summary
  // Which replica's failure the job reports (the one that failed first).
  failure_order failures;
  coordinator_state();
  ~coordinator_state();
  bool finished() const { return now == phase::finished; }
  static inline const char* name = "coordinator";
};

coordinator_actor::behavior_type coordinator(
    coordinator_actor::stateful_pointer<coordinator_state> self,
    std::shared_ptr<const job_plan> plan, std::shared_ptr<job_parts> parts);

// Hands this process's workers (and shards, and a strategy's hub) to the
// coordinator's parts, before run.
void hand_over(job_parts& parts, const worker_parts& workers, shard_set shards,
               std::shared_ptr<job_hub> hub);

// Runs the job (sends run, waits for the summary). Throws job_error with the
// coordinator's reason when the job failed.
nlohmann::json run_coordinator(caf::actor_system& sys, const coordinator_actor& coordinator);

}  // namespace troupe
