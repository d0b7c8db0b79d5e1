#pragma once
// What the config layer asks of a strategy: its cross-field rules and what
// the default placement over cluster tasks needs to know. A strategy
// (strategies/strategy.hpp) is a strategy_rules with the runtime half added;
// the registry by name (a named_registry, config/registry.hpp, like models',
// environments' and devices') lives here, at the bottom, so that parsing a
// config and running a job see the same strategies.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/strategy_keys.hpp"

namespace troupe {

struct job_config;

class strategy_rules {
 public:
  virtual ~strategy_rules() = default;
  // The value of strategy.kind that selects this strategy.
  virtual std::string name() const = 0;
  // The strategy.* keys it accepts besides "kind" (config/strategy_keys.hpp):
  // each read, validated and written back by its declaration.
  virtual std::vector<strategy_key> keys() const { return {}; }
  // The most replicas it runs: "replicas": "auto" takes no more.
  virtual int64_t max_replicas() const { return 65536; }
  // Rules on the strategy's own keys that involve more than one field; throws
  // config_error naming the JSON path. Runs after every field is valid.
  virtual void validate(const job_config&) const {}
  // Whether the job has variable shards (strategy.shards, ps tasks).
  virtual bool has_variable_shards() const { return false; }
  // Its replicas' steps can run on a data set resident on their device
  // (data.placement "device"; models/resident_steps.hpp).
  virtual bool runs_on_resident_data() const { return false; }
  // What one replica is called in messages about placement, how many the
  // job has and the key that sets that (placed over cluster tasks).
  virtual std::string replica_unit() const { return "replica"; }
  virtual int64_t replica_count(const job_config& c) const;
  virtual std::string replica_count_key() const { return "strategy.replicas"; }
  // The strategy's rules on the cluster's jobs: how many `workers` and `ps`
  // tasks it may have, with the default placement or explicit "hosts".
  // Throws config_error naming the path (cluster.tasks...).
  virtual void check_cluster_jobs(const job_config&, int64_t /*workers*/, int64_t /*ps*/,
                                  bool /*explicit_hosts*/) const {}
  // Whether the job trains a classifier on a dataset (model.kind "mlp");
  // false: a policy from environments (the "rl" section).
  virtual bool trains_classifier() const { return true; }
  // A strategy that does not train a classifier runs on cpu:N devices only,
  // unless it says it computes on discrete devices (sim:N, cuda:N) too.
  virtual bool computes_on_discrete_devices() const { return trains_classifier(); }
  // Whether a lost worker task leaves the job running (its replicas are
  // dropped) instead of ending it.
  virtual bool survives_lost_workers() const { return false; }
  // Whether its replicas take every step together, so that steps can go to
  // them in executions of training.steps_per_execution.
  virtual bool steps_together() const { return false; }
};

// Registers a strategy under its name(); throws std::invalid_argument when the
// name is taken. Built-in strategies register themselves (strategies/*.cpp).
void register_strategy_rules(std::shared_ptr<const strategy_rules> s);
// Null when no strategy of that name is registered.
std::shared_ptr<const strategy_rules> find_strategy_rules(const std::string& name);
// Registered names, sorted (what "expected one of" lists for strategy.kind).
std::vector<std::string> registered_strategies();
// The registered strategies that accept strategy.<key>, sorted by name.
std::vector<std::string> strategies_with_key(const std::string& key);

// Shared rule of the strategies where data.batch_size is the global batch:
// every replica needs at least one example of it.
void check_global_batch_covers_replicas(const job_config& c);

}  // namespace troupe
