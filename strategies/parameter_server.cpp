// parameter_server: asynchronous data parallelism (tf.distribute's
// ParameterServerStrategy, ps-lite). Each worker pulls the variables, computes
// the gradients of its own batch and pushes them; each shard applies every
// push on arrival, one update each. strategy.max_staleness bounds how far the
// fastest worker may run ahead of the slowest (stale synchronous parallel;
// 0 = bulk-synchronous). A lost worker is dropped and the job goes on; a
// restarted one rejoins.
//
// One update:
//   coordinator --train(worker step)--> worker --pull--> every shard
//     (device: install, gradients scaled 1/own batch)
//     --push(gradients of its pieces)--> every shard (applied on arrival) --> reply
#include "strategies/ssp_driver.hpp"
#include "strategies/strategy.hpp"
#include "strategies/variable_shards.hpp"

namespace troupe {
namespace {

class parameter_server final : public sharded_worker_strategy {
 public:
  std::string name() const override { return "parameter_server"; }
  std::string replica_unit() const override { return "worker"; }
  // strategy.replicas: the workers. Each push is one update: no
  // steps_per_update.
  std::vector<strategy_key> keys() const override {
    auto keys = strategy_keys::variable_shards();
    keys.push_back(strategy_keys::replicas());
    keys.push_back(strategy_keys::max_staleness());
    return keys;
  }
  void check_cluster_jobs(const job_config&, int64_t workers, int64_t ps, bool) const override {
    if (ps == 0)
      throw config_error("cluster.tasks",
                         "strategy.kind \"parameter_server\" needs a \"ps\" job with at least one "
                         "task (the variable shards live there)");
    if (workers == 0)
      throw config_error(
          "cluster.tasks",
          "strategy.kind \"parameter_server\" needs a \"worker\" job with at least one task");
  }

  std::unique_ptr<replica_step> make_replica_step(const job_config&,
                                                  const replica_wiring& w) const override {
    // Every push is an update of its own: the mean over this worker's batch.
    return std::make_unique<pull_compute_push_step>(w, /*local_mean=*/true);
  }
  std::unique_ptr<job_driver> make_driver(const job_plan& p) const override {
    ssp_driver::settings s;
    s.max_staleness = p.config.strategy.max_staleness;
    return std::make_unique<ssp_driver>(p, std::move(s));
  }
};

const strategy_registration registered{std::make_shared<parameter_server>()};

}  // namespace
}  // namespace troupe
