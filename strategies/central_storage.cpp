// central_storage: synchronous data parallelism with the variables on
// variable shards instead of on every replica (tf.distribute's
// CentralStorageStrategy). The shards sum one push per replica for a step
// and apply the update once; then every replica's push is answered.
//
// One step, per replica:
//   coordinator --train(s)--> replica --pull--> every shard
//     (device: install the pulled variables, gradients scaled 1/global batch)
//     --push(s, gradients of its pieces)--> every shard (aggregate mode: the
//     shard applies when all replicas' pushes for s are in) --> reply
#include "strategies/lockstep_driver.hpp"
#include "strategies/strategy.hpp"
#include "strategies/variable_shards.hpp"

namespace troupe {
namespace {

class central_storage final : public sharded_strategy {
 public:
  std::string name() const override { return "central_storage"; }
  std::vector<strategy_key> keys() const override {
    auto keys = strategy_keys::variable_shards();
    keys.push_back(strategy_keys::replicas());
    keys.push_back(strategy_keys::steps_per_update());
    return keys;
  }
  void validate(const job_config& c) const override { check_global_batch_covers_replicas(c); }

  variable_shard_config shard_config(const job_config& c, int64_t total_steps) const override {
    auto sc = sharded_strategy::shard_config(c, total_steps);
    sc.aggregate = c.strategy.replicas;
    return sc;
  }
  std::unique_ptr<replica_step> make_replica_step(const job_config&,
                                                  const replica_wiring& w) const override {
    return std::make_unique<pull_compute_push_step>(w, /*local_mean=*/false);
  }
  bool steps_together() const override { return true; }
  std::unique_ptr<job_driver> make_driver(const job_plan&) const override {
    return std::make_unique<lockstep_driver>();
  }
};

const strategy_registration registered{std::make_shared<central_storage>()};

}  // namespace
}  // namespace troupe
