#pragma once
#include <chrono>
#include <fstream>
#include <memory>
#include <vector>

#include "actors/job.hpp"
#include "actors/partitioner.hpp"
#include "checkpoint/checkpoint.hpp"
#include "data/dataset.hpp"
#include "messages/protocols.hpp"

namespace troupe {

// What the coordinator needs to drive a job, resolved before any actor starts.
struct job_plan {
  job_config config;
  job_options options;
  std::string output_dir;
  std::string checkpoint_dir;
  std::shared_ptr<const data::dataset> train;
  std::shared_ptr<const data::dataset> test;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t start_step = 0;
  std::optional<checkpoint::snapshot> resume_from;
  bool owner = true;  // this process writes the job's output (see detail::make_plan)
  // Across processes: the task hosting each replica ("worker:1"), so a
  // failure names it; empty in one process.
  std::vector<std::string> replica_tasks;
  // Every request the coordinator makes (to replicas, shards) fails after
  // this long; troupe node sets it for remote peers, whose pending requests
  // CAF never fails on its own when the peer vanishes.
  caf::duration request_timeout = caf::infinite;
};

// central_storage, parameter_server: where the variables live.
struct shard_set {
  std::vector<variable_shard_actor> actors;
  placement place;
  std::vector<std::string> slot_suffixes;  // the optimizer's slot names
};

// parameter_server: what the coordinator knows of each worker.
struct worker_status {
  int64_t clock = 0;     // steps this worker has finished
  bool busy = false;     // a step is in flight
  bool alive = true;     // lost workers are dropped, the job goes on
  int64_t admit_at = 0;  // takes steps once this many updates are done (late join)
  bool admitted = false;
};

struct coordinator_state {
  std::shared_ptr<const job_plan> plan;
  std::vector<replica_actor> replicas;
  shard_set shards;
  std::vector<worker_status> workers;  // parameter_server only
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
  int64_t last_eval_step = -1;
  std::string last_checkpoint;
  nlohmann::json shard_summary = nlohmann::json::object();  // staleness, for the summary
  static inline const char* name = "coordinator";
};

coordinator_actor::behavior_type coordinator(
    coordinator_actor::stateful_pointer<coordinator_state> self,
    std::shared_ptr<const job_plan> plan, std::vector<replica_actor> replicas,
    std::vector<std::pair<std::string, caf::actor>> others, shard_set shards = {});

}  // namespace troupe
