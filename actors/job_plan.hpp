#pragma once
// What a job is before any actor runs: the plan resolved from its config and
// its options (actors/job_options.hpp): data, step counts, where to resume.
// Below the topology builder (runtime/topology.hpp), the coordinator and the
// strategies, so none of them includes another upwards.
#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/fault_injection.hpp"
#include "actors/job_options.hpp"
#include "actors/partitioner.hpp"
#include "checkpoint/checkpoint.hpp"
#include "config/job_config.hpp"
#include "data/dataset.hpp"
#include "messages/protocols.hpp"

namespace troupe::monitoring {
class metrics_sink;  // monitoring/metrics_sink.hpp
}  // namespace troupe::monitoring

namespace troupe {

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
  // data.standardize: the per-feature statistics the data was standardised
  // with (saved with every checkpoint, as state "data/feature_mean" and
  // "data/feature_std": a model serving new inputs needs them). Empty when
  // not asked.
  std::vector<float> feature_mean, feature_std;
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
  // Where the coordinator's metrics lines go besides metrics.jsonl
  // (TensorBoard, /metrics: runtime/process_monitoring.hpp); null = nowhere.
  std::shared_ptr<monitoring::metrics_sink> metrics_sink;
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
