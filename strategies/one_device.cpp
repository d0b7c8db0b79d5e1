// one_device: one replica on one device, no communication (tf.distribute's
// OneDeviceStrategy). A step is one device task: gradients and update.
//
//   coordinator --train(s)--> replica --(device: gradients, update)--> reply
//
// With the data set on the device (data.placement), an execution's steps
// are resident_steps (models/resident_steps.hpp): gathered, computed and
// updated there, each a captured graph, their figures read back once.
#include "strategies/lockstep_driver.hpp"
#include "strategies/strategy.hpp"

namespace troupe {
namespace {

// Gradients and the update as one device task (an execution of several
// steps, one task for all); the next may be queued on the device right
// behind it.
class local_step final : public replica_step {
 public:
  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    std::vector<batch> bs;
    bs.push_back(std::move(b));
    run_steps(h, step, std::move(bs),
              [rp = std::move(rp)](std::vector<step_stats>& all) { rp.deliver(all.front()); });
  }
  bool runs_executions() const override { return true; }
  // On a device-resident data set the execution's steps run there, captured
  // as graphs; else each step's gradients and update.
  void run_steps(replica_host& h, int64_t first, std::vector<batch> bs,
                 execution_promise rp) override {
    run_execution_on_device(h, "forward_backward_update", first, std::move(bs),
                            resident_or_each(work(h), h.fail_at_step()), std::move(rp));
  }

 private:
  static device_step_fn work(replica_host& h) {
    return [fail = h.fail_at_step()](compute_state& cs, const batch& b, int64_t step) {
      auto s = compute_gradients(cs, b, step, fail, false);
      cs.apply_update();
      return s;
    };
  }
};

class one_device final : public strategy {
 public:
  std::string name() const override { return "one_device"; }
  // replicas: always 1 (a config may say so, or "auto").
  std::vector<strategy_key> keys() const override {
    return {strategy_keys::replicas(), strategy_keys::steps_per_update(),
            strategy_keys::check_replicas_every()};
  }
  int64_t max_replicas() const override { return 1; }
  void validate(const job_config& c) const override {
    if (c.strategy.replicas != 1)
      throw config_error("strategy.replicas",
                         "the one_device strategy runs exactly 1 replica, got " +
                             std::to_string(c.strategy.replicas));
    if (c.devices.size() != 1) {
      std::string list;
      for (const auto& d : c.devices) list += (list.empty() ? "\"" : ", \"") + d + "\"";
      throw config_error("devices", "the one_device strategy needs exactly one device, got " +
                                        std::to_string(c.devices.size()) + " (" + list + ")");
    }
  }
  void check_cluster_jobs(const job_config&, int64_t workers, int64_t,
                          bool explicit_hosts) const override {
    if (!explicit_hosts && workers > 1)
      throw config_error("cluster.tasks.worker",
                         "the one_device strategy runs one replica; expected at most 1 worker "
                         "task, got " +
                             std::to_string(workers));
  }
  bool replicas_must_agree() const override { return true; }
  std::unique_ptr<replica_step> make_replica_step(const job_config&,
                                                  const replica_wiring&) const override {
    return std::make_unique<local_step>();
  }
  bool steps_together() const override { return true; }
  bool runs_on_resident_data() const override { return true; }
  std::unique_ptr<job_driver> make_driver(const job_plan&) const override {
    return std::make_unique<lockstep_driver>();
  }
};

const strategy_registration registered{std::make_shared<one_device>()};

}  // namespace
}  // namespace troupe
