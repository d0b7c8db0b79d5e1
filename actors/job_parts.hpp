#pragma once
// The pieces a job is built from, shared by run_job (everything in one
// process) and troupe node (actors/node.hpp: each process builds the pieces
// its task hosts). One builder for both, so a strategy runs the same actors
// wherever they live.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/coordinator.hpp"
#include "actors/reducer.hpp"
#include "devices/device.hpp"
#include "messages/protocols.hpp"

namespace troupe::detail {

bool uses_replicas_only(const job_config& c);  // one_device, mirrored
bool elastic(const job_config& c);
bool uses_shards(const job_config& c);
bool async_workers(const job_config& c);  // parameter_server, elastic_average

// Resolves the plan: data, step counts, resume position. The owner (the one
// process that writes the job's output: run_job, or the chief) also checks
// and prepares the output directory and reads the checkpoint to resume from;
// other processes only load what their actors need and learn the start step
// from the chief.
std::shared_ptr<job_plan> make_plan(const job_config& c, const job_options& o, bool owner = true);

// Where every variable piece lives (the partitioner over the model's
// variables; the same in every process) and the optimizer slot names, with
// no actors yet.
shard_set plan_shards(const job_config& c, const job_plan& plan);

// Spawns the variable shards with the given indices into `set.actors` (in the
// order of `indices`).
void spawn_shards(caf::actor_system& sys, const job_config& c, const job_plan& plan,
                  const std::vector<int64_t>& indices, shard_set& set);

// The actors of some replicas: devices, input pipelines, replicas, and the
// reducers the caller gave them.
struct worker_parts {
  std::map<std::string, std::shared_ptr<cpu_device>> devices;
  std::vector<int64_t> indices;  // global replica indices, in the order below
  std::vector<input_pipeline_actor> pipelines;
  std::vector<replica_actor> replicas;
  std::vector<reducer_actor> reducers;
  // Every actor by name, for the coordinator to monitor.
  std::vector<std::pair<std::string, caf::actor>> named() const;
  // Sends every actor an exit (user_shutdown).
  void stop() const;
};

// The reducer settings of the job's config.
reducer_config reducer_config_of(const job_config& c);

struct worker_spec {
  std::vector<int64_t> indices;              // global replica indices
  std::vector<std::string> devices;          // devices[k] runs indices[k]
  std::vector<reducer_actor> reducers;       // one per replica (mirrored), else empty
  bool shard_optimizer = false;              // the reducers support reduce_scatter/all_gather
  std::vector<variable_shard_actor> shards;  // every shard, by index (shard strategies)
  placement place;
  int64_t start_step = 0;
  caf::duration request_timeout = caf::infinite;  // see replica_config
};

// data.gather: whether a process with these devices gathers batches on them
// (auto: for synchronous strategies, whose devices wait for each other every
// step, when the device threads take every core).
bool gathers_on_device(const std::string& gather, bool synchronous,
                       const std::vector<std::string>& devices);

// Spawns the replicas of `spec` with their devices and input pipelines; each
// pipeline reads only its replica's slice of every global batch.
worker_parts spawn_workers(caf::actor_system& sys, const job_config& c, const job_plan& plan,
                           worker_spec spec, const job_options& o);

}  // namespace troupe::detail
