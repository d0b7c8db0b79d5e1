#pragma once
// The one topology builder: the actors a process hosts for a job, shared by
// `troupe run` (every actor in one process, runtime/job.hpp) and `troupe node`
// (the actors of one task, runtime/node.hpp). What the actors are wired to is
// the strategy's (strategies/strategy.hpp); where they live is the caller's.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/job_plan.hpp"
#include "actors/reducer.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "actors/worker_parts.hpp"
#include "devices/device.hpp"
#include "messages/protocols.hpp"
#include "strategies/strategy.hpp"

namespace troupe {

// Resolves the plan: the strategy, data, step counts, resume position. The
// owner (the one process that writes the job's output: run_job, or the
// chief) also checks and prepares the output directory and reads the
// checkpoint to resume from; other processes only load what their actors
// need and learn the start step from the chief. Throws config_error for a
// strategy that is not built, job_error for the rest.
std::shared_ptr<job_plan> make_plan(const job_config& c, const job_options& o, bool owner = true);

// A file of the job's output (config.json, summary.json) written whole, never
// through a planted symbolic or hard link (monitoring/output_file.hpp);
// throws job_error naming the path.
void write_job_file(const std::string& path, const std::string& text);

// Where every variable piece lives (the partitioner over the model's
// variables; the same in every process) and the shards' optimizer slot
// names, with no actors yet. Empty for a strategy without shards.
shard_set plan_shards(const job_plan& plan);
// The bytes of the job's model variables (4 per element), or 0 for a job
// without a dataset (reinforcement learning); sizes the largest message.
uint64_t model_state_bytes(const job_plan& plan);

// For `troupe validate`: a model of layers against the data it would train
// on (read as a job would: the example's shape, the labels its loss needs).
// Throws config_error naming the JSON path of a layer or a loss that does
// not fit, job_error for data that cannot be read; nothing for other models
// or strategies that train from environments.
void check_model_against_data(const job_config& c);

// Spawns the variable shards with the given indices into `set.actors` (in the
// order of `indices`).
void spawn_shards(caf::actor_system& sys, const job_plan& plan, const std::vector<int64_t>& indices,
                  shard_set& set);

// data.gather resolved: where a process with these devices gathers its
// batches. auto: with device collectives (the step is one device task with
// its collectives inside, so a device never idles between steps) on host
// devices, in the step; for other lockstep strategies, whose devices wait for
// each other every step, on the devices' idle time when the device threads
// take every core; else on the pipeline's thread.
enum class gather_place { pipeline, device, step };
gather_place gather_place_for(const std::string& gather, bool lockstep,
                              const std::vector<std::string>& devices,
                              bool device_collectives = false);

// Spawns the replicas of `spec` with their devices, input pipelines and the
// strategy's reducers; each pipeline reads only its replica's slice of every
// global batch.
worker_parts spawn_workers(caf::actor_system& sys, const job_plan& plan, worker_spec spec);

// The workers of `spec`: a strategy's own (strategy::own_job), wired to its
// hub's handles, or replicas (spawn_workers).
worker_parts spawn_job_workers(caf::actor_system& sys, std::shared_ptr<const job_plan> plan,
                               worker_spec spec, const caf::message& hub);
// What a process spawned for a job (its workers, shards and a strategy's
// hub), stopped and joined in the one order that `troupe run` and
// `troupe node` both need: an exit to every actor; then, once every handle
// is dropped, the actor system's last actor; then the device threads, after
// their last task; then the hub and its devices.
struct job_actors {
  worker_parts workers;
  std::vector<variable_shard_actor> shards;
  std::shared_ptr<job_hub> hub;
  // Sends every actor here, and `also` (the coordinator, the node actor, the
  // ring node), an exit. All are this process's (a ps task's shards stop on
  // its own node's stop), so the exits may go without a sender.
  void stop(const std::vector<caf::actor>& also = {}) const;
  // Drops every handle here and waits for the actor system's last actor
  // (the caller drops its own handles first), then joins the devices.
  void join(caf::actor_system& sys);
};

}  // namespace troupe
