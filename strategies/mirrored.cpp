// mirrored: synchronous data parallelism with all-reduce (tf.distribute's
// MirroredStrategy, PyTorch DDP). Every replica holds the whole model, takes
// its slice of each global batch, and the replicas' gradients are summed
// (every replica scaled its own by 1/global batch, so the sum is the mean
// over the global batch). Replicas stay bit-identical
// (strategy.check_replicas_every verifies it).
//
// This file holds the strategy: its rules, the reducers or device group it
// makes, and its one replica step (strategies/mirrored_step.cpp), which
// issues its collectives through a process_group whatever runs them: the
// device group (NCCL; the host group on cpu:N and sim:N), the reducer actors
// (ring, tree, reduce_to_one), or, across processes, the hierarchical
// composite (in the process, between the processes, back).
//
// With strategy.shard_optimizer (ZeRO stage 1, cpu devices, one process) the
// gradients are reduce-scattered and each replica updates its own chunks;
// across processes every replica applies the whole update (logged when it
// applies).
#include <spdlog/spdlog.h>

#include "collectives/nccl_id.hpp"
#include "strategies/lockstep_driver.hpp"
#include "strategies/mirrored_steps.hpp"
#include "strategies/replica_group.hpp"
#include "strategies/strategy.hpp"

namespace troupe {
namespace {

class mirrored final : public strategy {
 public:
  std::string name() const override { return "mirrored"; }
  std::vector<strategy_key> keys() const override {
    return {strategy_keys::replicas(), strategy_keys::steps_per_update(),
            strategy_keys::reducer({reducer_algorithm::ring, reducer_algorithm::tree,
                                    reducer_algorithm::reduce_to_one, reducer_algorithm::device}),
            field_key("shard_optimizer", &strategy_config::shard_optimizer, boolean()),
            strategy_keys::check_replicas_every()};
  }

  // What the device all-reduce (reducer "device") needs. (The sharded update,
  // strategy.shard_optimizer, is a CPU feature: on discrete devices every
  // replica applies the whole update, logged.)
  void validate(const job_config& c) const override {
    check_global_batch_covers_replicas(c);
    const auto& red = c.strategy.reducer;
    // Settings of the direct links mean nothing on another path.
    auto direct_only = [&](const std::string& key, const char* value, bool usual) {
      if (!usual && (red.algorithm != reducer_algorithm::device ||
                     red.transport != reducer_transport::direct))
        throw config_error("strategy.reducer." + key,
                           std::string("\"") + value +
                               "\" is for the direct links between processes (algorithm "
                               "\"device\", transport \"direct\"), got algorithm \"" +
                               name_of(red.algorithm) + "\", transport \"" +
                               name_of(red.transport) + "\"");
    };
    direct_only("wire", name_of(red.wire), red.wire == wire_format::fp32);
    direct_only("same_host", name_of(red.same_host),
                red.same_host == same_host_link::shared_memory);
    direct_only("yield_us", std::to_string(red.yield_us).c_str(),
                red.yield_us == reducer_settings{}.yield_us);
    if (c.strategy.reducer.algorithm != reducer_algorithm::device) return;
    auto kind_of = [](const std::string& d) { return d.substr(0, d.find(':')); };
    for (const auto& d : c.devices)
      if (kind_of(d) != kind_of(c.devices.front()))
        throw config_error("devices", "the device all-reduce needs devices of one kind, got " +
                                          json_read::show(nlohmann::json(c.devices)));
    if (!c.cluster && c.strategy.replicas > static_cast<int64_t>(c.devices.size()))
      throw config_error("strategy.replicas",
                         "the device all-reduce needs one device per replica: " +
                             std::to_string(c.strategy.replicas) + " replicas on " +
                             std::to_string(c.devices.size()) + " devices");
  }
  bool replicas_must_agree() const override { return true; }
  bool reduces_across_processes() const override { return true; }

  reducer_parts make_reducers(caf::actor_system& sys, const job_config& c,
                              const reducer_wiring& w) const override {
    if (c.strategy.shard_optimizer && w.ring_tasks.size() > 1 &&
        c.strategy.reducer.algorithm != reducer_algorithm::device)
      spdlog::info(
          "mirrored across processes: every replica applies the whole update "
          "(strategy.shard_optimizer shards the update within one process only)");
    return make_collective_parts(sys, c, w);
  }

  // NCCL across processes: one communicator over every replica, its id made
  // here on the chief (ncclGetUniqueId starts NCCL's bootstrap root in this
  // process, which lives as long as the job). Hierarchical, or on cpu/sim
  // devices (an in-process group): none.
  std::string device_group_id(const job_config& c, std::size_t processes) const override {
    if (c.strategy.reducer.algorithm != reducer_algorithm::device || processes < 2 ||
        c.strategy.reducer.hierarchical ||
        parse_device(c.devices.front()).kind != device_spec::kind_t::cuda)
      return {};
    auto id = nccl_group_id(*make_nccl_rendezvous(static_cast<int>(c.strategy.replicas)));
    return {id.begin(), id.end()};
  }

  std::unique_ptr<replica_step> make_replica_step(const job_config& c,
                                                  const replica_wiring& w) const override {
    const bool discrete = parse_device(c.devices.front()).discrete();
    const bool sharded = c.strategy.shard_optimizer && !w.across_processes && !discrete;
    if (c.strategy.shard_optimizer && !sharded && w.index == 0 && discrete)
      spdlog::info(
          "mirrored on {}: every replica applies the whole update (strategy.shard_optimizer "
          "shards it on cpu devices only)",
          c.devices.front());
    return make_mirrored_step(w, reducer_config_of(c), sharded);
  }
  // Device collectives with the ring of processes between them (every
  // device kind but cuda's one communicator over the job).
  bool uses_process_links(const job_config& c) const override {
    const bool one_nccl_group = parse_device(c.devices.front()).kind == device_spec::kind_t::cuda &&
                                !c.strategy.reducer.hierarchical;
    return c.strategy.reducer.algorithm == reducer_algorithm::device && !one_nccl_group &&
           c.strategy.reducer.transport == reducer_transport::direct;
  }
  bool steps_together() const override { return true; }
  bool replicas_wait_on_device() const override { return true; }
  std::unique_ptr<job_driver> make_driver(const job_plan&) const override {
    return std::make_unique<lockstep_driver>();
  }

  // With sharded slots every replica takes part in gathering them (a
  // collective), and then any of them holds the whole state.
  void snapshot(coordinator_host& h, std::function<void(model_state&)> k) const override {
    if (!h.plan().config.strategy.shard_optimizer) {
      strategy::snapshot(h, std::move(k));
      return;
    }
    collect_replica_states(h, [k](std::vector<model_state>& all) { k(all.front()); });
  }
};

const strategy_registration registered{std::make_shared<mirrored>()};

}  // namespace
}  // namespace troupe
