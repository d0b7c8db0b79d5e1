#pragma once
// A strategy is a message protocol between the job's actors, chosen by
// strategy.kind. Each lives in one file of strategies/ and registers itself
// by name; the runtime (runtime/) calls it at these points:
//
//   config     keys(), validate(), placement rules  (config/strategy_rules.hpp)
//   plan       updates_per_epoch(), input()         how far an epoch is, what a replica reads
//   topology   shard_config(), make_reducers(),     which actors the job needs
//              make_replica_step()
//   replica    replica_step::run()                  one training step on one replica
//   driver     make_driver()                        lockstep or per-worker issuing of steps
//   boundary   snapshot(), restore(), evaluate(),   checkpoints and evaluation
//              on_epoch_end(), replicas_must_agree()
//   own job    own_job(), spawn_hub(),              a job of its own actors (actor_learner)
//              spawn_own_workers()
//
// Shared mechanisms live beside the strategies: strategies/lockstep_driver,
// strategies/ssp_driver (per-worker, staleness-bounded), strategies/
// variable_shards (pull, compute, push; shard checkpoints).
#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/job_plan.hpp"
#include "actors/strategy_api.hpp"
#include "actors/worker_parts.hpp"
#include "collectives/process_group.hpp"
#include "config/strategy_rules.hpp"

namespace troupe {

// The chief's actors of a strategy with a job of its own (strategy::spawn_hub).
// Kept until the actor system is done (it owns their devices).
class job_hub {
 public:
  virtual ~job_hub() = default;
  // What every worker is wired to, as typed handles in one message (it
  // travels in troupe node's build order).
  virtual caf::message handles() const = 0;
  // The hub's actors by name, for the coordinator to watch.
  virtual std::vector<std::pair<std::string, caf::actor>> named() const = 0;
  // The coordinator's driver over these workers (by index).
  virtual std::unique_ptr<job_driver> make_driver(
      std::vector<std::pair<int64_t, caf::actor>> workers) = 0;
  // Sends the hub's actors an exit.
  virtual void stop() = 0;
};

class strategy : public strategy_rules {
 public:
  // --- the plan ---
  // Updates in one epoch of `examples` training examples (0: no epochs; the
  // job then ends by training.max_steps).
  virtual int64_t updates_per_epoch(const job_config& c, int64_t examples) const;
  // What each input pipeline reads, resuming at update `start_step`.
  virtual input_plan input(const job_config& c, int64_t start_step, int64_t steps_per_epoch) const;
  // Replicas wait on each other every step (data.gather "auto" gathers on
  // the devices then).
  virtual bool lockstep() const { return true; }

  // --- the topology ---
  // The variable shards' settings (has_variable_shards() only).
  virtual variable_shard_config shard_config(const job_config& c, int64_t total_steps) const;
  // Whether replicas in several processes reduce through a ring of the
  // processes (troupe node then wires it before make_reducers).
  virtual bool reduces_across_processes() const { return false; }
  // On the chief of a job over `processes` processes with replicas: the id
  // of a device collective group spanning all of them, sent to every task
  // in the build order (mirrored: NCCL's ncclUniqueId), or empty.
  virtual std::string device_group_id(const job_config&, std::size_t /*processes*/) const {
    return {};
  }
  // Whether the process's first replica also gets direct links to the other
  // processes' (runtime/process_ring.hpp), set up by troupe node after the
  // ring of processes is wired.
  virtual bool uses_process_links(const job_config&) const { return false; }
  // Whether a replica's step waits on its device thread for its peers (a
  // collective issued from the device task): then replicas placed on one
  // device each get a thread of their own, or the first to wait would hold
  // the thread its peer needs to arrive.
  virtual bool replicas_wait_on_device() const { return false; }
  virtual reducer_parts make_reducers(caf::actor_system&, const job_config&,
                                      const reducer_wiring&) const {
    return {};
  }
  // The replica side and the driver of a strategy with replicas (every one
  // whose own_job() is false).
  virtual std::unique_ptr<replica_step> make_replica_step(const job_config& c,
                                                          const replica_wiring& w) const;

  // --- the coordinator ---
  virtual std::unique_ptr<job_driver> make_driver(const job_plan& p) const;

  // --- a job of other actors ---
  // A strategy whose job is not replicas stepping over a dataset
  // (actor_learner: rl_actors, learners, a trajectory queue) spawns its own
  // actors: a hub on the chief (spawn_hub), wired to the job's coordinator,
  // and in every process that hosts some, workers placed like replicas
  // (spawn_own_workers), wired to the hub's handles. The runtime then builds
  // no replica; the hub makes the coordinator's driver.
  virtual bool own_job() const { return false; }
  virtual std::unique_ptr<job_hub> spawn_hub(caf::actor_system& sys,
                                             std::shared_ptr<const job_plan> plan,
                                             const coordinator_actor& coordinator) const;
  // In a process hosting spec.indices on spec.devices; the actors go in
  // `others`, their devices in `devices`. `hub` is job_hub::handles() (it
  // travels in the build order); one that is not this strategy's is a
  // job_error.
  virtual worker_parts spawn_own_workers(caf::actor_system& sys,
                                         std::shared_ptr<const job_plan> plan,
                                         const worker_spec& spec, const caf::message& hub) const;
  // The learning rate a metrics line reports for update `completed`.
  virtual double reported_lr(const job_plan&, int64_t /*completed*/, const step_stats& s) const {
    return s.lr;
  }
  // Replicas hold bit-identical variables (strategy.check_replicas_every
  // verifies it).
  virtual bool replicas_must_agree() const { return false; }
  // The model and optimizer state a checkpoint saves; no step is in flight.
  // Default: replica 0's.
  virtual void snapshot(coordinator_host& h, std::function<void(model_state&)> k) const;
  // Whether the optimizer slots snapshot() saves are one replica's, which
  // counted only its own share of the steps (the checkpoint says so, and its
  // "optimizer/step" is then checked to be at most the step).
  virtual bool snapshot_slots_count_own_steps() const { return false; }
  // Puts a checkpoint's state back before the first step. Default: every
  // replica restores it.
  virtual void restore(coordinator_host& h, std::shared_ptr<const model_state> ms,
                       std::function<void()> k) const;
  // Extra metrics at the end of an epoch (after the training figures).
  virtual void on_epoch_end(coordinator_host&, int64_t /*epoch*/) const {}
  // Evaluation when due: calls k with the figures for the metrics line
  // (e.g. test_loss, test_accuracy). Default: the test set on the first live
  // replica.
  virtual void evaluate(coordinator_host& h, std::function<void(nlohmann::json)> k) const;
};

// Every replica restores the state (strategy::restore's default).
void restore_every_replica(coordinator_host& h, std::shared_ptr<const model_state> ms,
                           std::function<void()> k);

// Registers a strategy by its name() (built-ins register themselves; a user
// or test may add its own before running a job). Throws when the name is taken.
inline void register_strategy(std::shared_ptr<const strategy> s) {
  register_strategy_rules(std::move(s));
}
// The strategy of that name; null when none (or only config rules) is registered.
inline std::shared_ptr<const strategy> find_strategy(const std::string& name) {
  return std::dynamic_pointer_cast<const strategy>(find_strategy_rules(name));
}

// For a strategy file: `const strategy_registration registered{std::make_shared<x>()};`
struct strategy_registration {
  explicit strategy_registration(std::shared_ptr<const strategy> s) {
    register_strategy(std::move(s));
  }
};

}  // namespace troupe
