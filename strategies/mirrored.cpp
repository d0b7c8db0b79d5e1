// mirrored: synchronous data parallelism with all-reduce (tf.distribute's
// MirroredStrategy, PyTorch DDP). Every replica holds the whole model, takes
// its slice of each global batch, and the replicas' gradients are summed
// (every replica scaled its own by 1/global batch, so the sum is the mean
// over the global batch). Replicas stay bit-identical
// (strategy.check_replicas_every verifies it).
//
// This file holds the strategy: its rules, the reducers it spawns, and which
// replica step runs (one class per protocol, strategies/mirrored_steps.hpp):
//
//   strategy.reducer.algorithm   strategy.shard_optimizer   step
//   a reducer actor's            no                         mirrored_allreduce.cpp
//                                yes, one process, cpu      mirrored_zero.cpp
//   "device", one process or     either (ZeRO-1 on cpu)     mirrored_device.cpp
//     one NCCL group over the job
//   "device", across processes   no                         mirrored_device_ring.cpp
//
// Across processes the reducer actors are hierarchical (in the process, a
// ring of processes, back; actors/reducers/hierarchical.hpp), and the
// sharded update is not used: reduce-scatter and all-gather are in-process
// collectives, so every replica applies the whole update there (logged when
// it applies).
#include <spdlog/spdlog.h>

#include "actors/reducers/hierarchical.hpp"
#include "devices/nccl_id.hpp"
#include "strategies/lockstep_driver.hpp"
#include "strategies/mirrored_steps.hpp"
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
    auto direct_only = [&](const std::string& key, const std::string& value, const char* usual) {
      if (value != usual &&
          (red.algorithm != reducer_algorithm::device || red.transport != "direct"))
        throw config_error("strategy.reducer." + key,
                           "\"" + value +
                               "\" is for the direct links between processes (algorithm "
                               "\"device\", transport \"direct\"), got algorithm \"" +
                               name_of(red.algorithm) + "\", transport \"" + red.transport + "\"");
    };
    direct_only("wire", red.wire, "fp32");
    direct_only("same_host", red.same_host, "unix");
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
    reducer_parts out;
    if (c.strategy.reducer.algorithm == reducer_algorithm::device && !w.device_group_id.empty()) {
      nccl_unique_id id{};
      if (w.device_group_id.size() != id.size())
        throw job_error("the build order's NCCL group id has " +
                        std::to_string(w.device_group_id.size()) + " bytes, expected " +
                        std::to_string(id.size()));
      std::copy(w.device_group_id.begin(), w.device_group_id.end(), id.begin());
      out.device_group = make_nccl_group(static_cast<int>(c.strategy.replicas), id);
      out.device_group_global = true;
      return out;
    }
    if (c.strategy.reducer.algorithm == reducer_algorithm::device) {
      out.device_group =
          make_device_collective_group(w.local_replicas, parse_device(c.devices.front()));
      return out;
    }
    auto local = spawn_reducer_group(sys, w.local_replicas, reducer_config_of(c));
    if (w.ring_tasks.size() < 2) {
      out.per_replica = std::move(local);
      return out;
    }
    if (c.strategy.shard_optimizer)
      spdlog::info(
          "mirrored across processes: every replica applies the whole update "
          "(strategy.shard_optimizer shards the update within one process only)");
    for (int k = 0; k < w.local_replicas; ++k) {
      hierarchical_config hc;
      hc.local = local[static_cast<std::size_t>(k)];
      hc.local_rank = k;
      if (k == 0) hc.ring = w.ring;
      hc.global_replicas = c.strategy.replicas;
      hc.ring_names = w.ring_tasks;
      out.per_replica.push_back(spawn_hierarchical_reducer(sys, hc));
    }
    out.underneath = std::move(local);
    return out;
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
    auto id = nccl_group_id(*make_nccl_group(static_cast<int>(c.strategy.replicas)));
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
    if (!w.device_group)
      return sharded ? make_mirrored_zero_step(w, reducer_config_of(c))
                     : make_mirrored_allreduce_step(w);
    // A global group (NCCL over every replica of the job) needs no ring.
    if (w.across_processes && !w.device_group_global)
      return make_mirrored_device_ring_step(w, reducer_config_of(c));
    return make_mirrored_device_step(w, reducer_config_of(c), sharded);
  }
  // Device collectives with the ring of processes between them (every
  // device kind but cuda's one communicator over the job).
  bool uses_process_links(const job_config& c) const override {
    const bool one_nccl_group = parse_device(c.devices.front()).kind == device_spec::kind_t::cuda &&
                                !c.strategy.reducer.hierarchical;
    return c.strategy.reducer.algorithm == reducer_algorithm::device && !one_nccl_group &&
           c.strategy.reducer.transport == "direct";
  }
  bool steps_together() const override { return true; }
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
