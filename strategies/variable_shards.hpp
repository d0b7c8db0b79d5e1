#pragma once
// The mechanism of the strategies whose variables live on variable shards
// (central_storage, parameter_server, elastic_average's center):
//  - replica side: pull every shard, install the pulled pieces as the
//    model's variables, split gradients (or deltas) by shard piece; the
//    pull/compute/push step; evaluation on the shards' variables;
//  - coordinator side: a checkpoint joined from every shard's state, a
//    restore split over the shards, the shards' counters as metrics, and the
//    learning rate the shards' optimizer uses.
#include <functional>
#include <vector>

#include "strategies/strategy.hpp"

namespace troupe {

// Pulls every shard's pieces (all at once), then calls k with them in shard
// order. A shard that died is the coordinator's to report (it monitors the
// shards): other errors end the replica.
void pull_all(replica_host& h, const std::vector<variable_shard_actor>& shards,
              std::function<void(std::vector<shard_values>&)> k);
// The pulled pieces as the model's variables, in its order: an unsplit
// variable is the shard's tensor itself (a shard never writes a buffer it
// handed out), a split one is joined. Throws naming a missing piece or a
// wrong shape.
std::vector<tensor> pulled_variables(const compute_state& cs, const placement& place,
                                     const std::vector<shard_values>& pulled);
void install_pulled(compute_state& cs, const placement& place,
                    const std::vector<shard_values>& pulled);
// Per shard, its pieces of `grads` (named by piece); an unsplit variable's
// buffer itself (the shard is done with it when it replies).
std::vector<std::vector<named_tensor>> split_for_shard_pieces(
    const std::vector<named_tensor>& grads, const placement& place, std::size_t shards);
// The error handler of a request to a shard.
std::function<void(caf::error&)> shard_failed(replica_host& h);
// replica_step::eval_variables for a model on the shards: pull, install.
void eval_on_shards(replica_host& h, const replica_wiring& w,
                    std::function<void(std::function<void(compute_state&)>)> k);

// One step against the shards: pull, gradients, push; done when every shard
// has applied its part (parameter_server: on arrival; central_storage: once
// all replicas' pushes for the step are in). With local_mean the gradients
// are the mean over this worker's batch (every push is an update of its own),
// else over the global batch.
class pull_compute_push_step final : public replica_step {
 public:
  pull_compute_push_step(replica_wiring w, bool local_mean)
      : wiring_(std::move(w)), local_mean_(local_mean) {}
  void run(replica_host& h, int64_t step, batch b, step_promise rp) override;
  void eval_variables(replica_host& h,
                      std::function<void(std::function<void(compute_state&)>)> k) override {
    eval_on_shards(h, wiring_, std::move(k));
  }

 private:
  replica_wiring wiring_;
  bool local_mean_;
};

// A strategy whose model lives on the shards: checkpoints are the shards'
// state, the shards' counters are reported every epoch, and the learning rate
// reported is the shards' schedule.
class sharded_strategy : public strategy {
 public:
  bool has_variable_shards() const override { return true; }
  double reported_lr(const job_plan& p, int64_t completed, const step_stats&) const override;
  void snapshot(coordinator_host& h, std::function<void(model_state&)> k) const override;
  void restore(coordinator_host& h, std::shared_ptr<const model_state> ms,
               std::function<void()> k) const override;
  void on_epoch_end(coordinator_host& h, int64_t epoch) const override;
};

// The shards' joined state (no step is in flight at a boundary: every shard
// is at the same version).
void snapshot_shards(coordinator_host& h, std::function<void(model_state&)> k);
// The checkpoint's state split over the shards, at version start_step.
void restore_shards(coordinator_host& h, const model_state& ms, std::function<void()> k);
// Each shard's counters as a metrics line (staleness for parameter_server);
// the latest go into the summary.
void write_shard_stats(coordinator_host& h, int64_t epoch);
// The replicas' own optimizers never step: the schedule says.
double scheduled_lr(const job_plan& p, int64_t completed);

}  // namespace troupe
