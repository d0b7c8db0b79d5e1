// What a strategy does unless it says otherwise (strategies/strategy.hpp).
#include "strategies/strategy.hpp"

#include "actors/input_pipeline.hpp"

namespace troupe {

// Lockstep: an update is one global batch (of steps_per_update micro-batches).
int64_t strategy::updates_per_epoch(const job_config& c, int64_t examples) const {
  return batches_per_epoch(examples, c.data.batch_size, c.strategy.steps_per_update);
}

input_plan strategy::input(const job_config& c, int64_t start_step, int64_t steps_per_epoch) const {
  input_plan in;
  in.global_batch = c.data.batch_size;
  if (steps_per_epoch > 0) {
    in.start_epoch = start_step / steps_per_epoch;
    in.start_index = start_step % steps_per_epoch;
  }
  return in;
}

variable_shard_config strategy::shard_config(const job_config& c, int64_t total_steps) const {
  variable_shard_config sc;
  sc.optimizer = c.optimizer;
  sc.total_steps = total_steps;
  return sc;
}

void strategy::snapshot(coordinator_host& h, std::function<void(model_state&)> k) const {
  h.self()
      ->request(h.replicas().front(), h.request_timeout(), state_atom::value)
      .then([k](model_state& ms) { k(ms); }, h.failed("checkpoint snapshot failed"));
}

void strategy::restore(coordinator_host& h, std::shared_ptr<const model_state> ms,
                       std::function<void()> k) const {
  restore_every_replica(h, std::move(ms), std::move(k));
}

void restore_every_replica(coordinator_host& h, std::shared_ptr<const model_state> ms,
                           std::function<void()> k) {
  auto& replicas = h.replicas();
  fan_in<int64_t> restored(
      replicas.size(), [k](std::vector<int64_t>&) { k(); },
      h.failed("restoring " + h.resumed_checkpoint() + " failed"));
  for (std::size_t i = 0; i < replicas.size(); ++i)
    h.self()
        ->request(replicas[i], h.request_timeout(), restore_atom::value, *ms)
        .then(restored.reply(i), restored.error());
}

void strategy::evaluate(coordinator_host& h, std::function<void(nlohmann::json)> k) const {
  const auto& p = h.plan();
  if (!p.test || p.test->size() == 0) {
    k(nlohmann::json::object());
    return;
  }
  h.self()
      ->request(h.live_replicas().front(), h.request_timeout(), eval_atom::value, p.test->images,
                p.test->labels)
      .then(
          [k](metric_sums& e) {
            double n = static_cast<double>(std::max<int64_t>(1, e.count));
            k({{"test_loss", e.loss_sum / n},
               {"test_accuracy", static_cast<double>(e.correct) / n}});
          },
          h.failed("evaluation failed"));
}

std::unique_ptr<replica_step> strategy::make_replica_step(const job_config&,
                                                          const replica_wiring&) const {
  throw std::logic_error("strategy " + name() + " has no replicas");
}

std::unique_ptr<job_driver> strategy::make_driver(const job_plan&) const {
  throw std::logic_error("strategy " + name() + " has no replica driver");
}

std::unique_ptr<job_hub> strategy::spawn_hub(caf::actor_system&, std::shared_ptr<const job_plan>,
                                             const coordinator_actor&) const {
  throw std::logic_error("strategy " + name() + " runs replicas, not a job of its own");
}

worker_parts strategy::spawn_own_workers(caf::actor_system&, std::shared_ptr<const job_plan>,
                                         const worker_spec&, const caf::message&) const {
  throw std::logic_error("strategy " + name() + " runs replicas, not a job of its own");
}

}  // namespace troupe
