// mirrored: synchronous data parallelism with all-reduce (tf.distribute's
// MirroredStrategy, PyTorch DDP). Every replica holds the whole model, takes
// its slice of each global batch, and the replicas' gradients are summed by
// their reducers (actors/reducer.hpp; in several processes the hierarchical
// reducer: in the process, then a ring of processes, then back).
//
// One step, per replica:
//   coordinator --train(s)--> replica --(device: gradients, scaled 1/global batch)
//     full update:    --allreduce(sum)--> reducer --> (device: update)
//     sharded update: --reduce_scatter(sum)--> reducer --> (device: update own segments)
//                     --all_gather(variables)--> reducer --> reply
// Replicas stay bit-identical (strategy.check_replicas_every verifies it).
//
// Across processes, the sharded update (ZeRO stage 1: strategy.shard_optimizer)
// is not used: reduce-scatter and all-gather are in-process collectives, so
// every replica applies the whole update there (logged when it applies).
//
// With strategy.reducer.algorithm "nccl" the all-reduce is a device
// collective (devices/device_communicator.hpp: NCCL on cuda:N, an in-process
// equivalent on cpu:N and sim:N): the whole step is one device task, and the
// gradients never leave the device:
//   coordinator --train(s)--> replica --(device: gradients, all-reduce per
//     bucket of the fused gradient block, update)--> reply
// On a discrete device with a reducer actor, the gradients are staged to the
// host for the collective and back for the update.
#include <spdlog/spdlog.h>

#include "actors/reducers/hierarchical.hpp"
#include "devices/nccl_id.hpp"
#include "runtime/topology.hpp"
#include "strategies/lockstep_driver.hpp"
#include "strategies/strategy.hpp"

namespace troupe {
namespace {

class mirrored_step final : public replica_step {
 public:
  mirrored_step(replica_wiring w, bool sharded, reducer_config rc)
      : wiring_(std::move(w)),
        sharded_(sharded),
        reducer_cfg_(rc),
        segments_(std::make_shared<std::vector<std::pair<int64_t, int64_t>>>()) {}

  // Leaving a device collective group ends its collectives on every rank: a
  // replica that fails or stops must not leave its peers blocked in one.
  ~mirrored_step() override {
    if (wiring_.device_group)
      wiring_.device_group->abort("replica " + std::to_string(wiring_.index) + " stopped");
  }

  void init(compute_state& cs) override {
    if (wiring_.device_group)
      cs.collectives = wiring_.device_group->join(
          static_cast<int>(wiring_.device_group_global ? wiring_.index : wiring_.local_index),
          *cs.dev);
    if (!sharded_) return;
    if (wiring_.device_group) {
      *segments_ = device_shard_ranges(cs, *cs.collectives);
      return;
    }
    int64_t numel = 0;
    for (auto& g : cs.grads) numel += g.value.numel();
    *segments_ = reduce_scatter_segments(numel, reducer_cfg_, static_cast<int>(wiring_.replicas),
                                         static_cast<int>(wiring_.index));
  }

  // Gradients, then the collective (sum: every replica already scaled its
  // gradients by 1/global_size, so the sum is the mean over the global
  // batch), then the update.
  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    if (wiring_.device_group) {
      device_collective_step(h, step, std::move(b), std::move(rp));
      return;
    }
    h.set_busy(true);
    auto epoch = b.epoch;
    h.on_device<step_stats>(
        "forward_backward",
        [b = std::move(b), step, fail = h.fail_at_step()](compute_state& cs) {
          auto s = compute_gradients(cs, b, step, fail, false);
          cs.gradients_to_host();  // for the reducer (nothing to do on cpu:N)
          return s;
        },
        [this, &h, rp, epoch](step_stats& s) mutable {
          s.epoch = epoch;
          h.count(s);
          if (sharded_) {
            sharded_update(h, s, rp);
            return;
          }
          h.communicating("all_reduce");
          h.self()
              ->request(wiring_.reducer, h.request_timeout(), allreduce_atom::value, reduce_op::sum,
                        h.gradient_buffers())
              .then(
                  [this, &h, s, rp](std::vector<tensor>&) mutable {
                    h.communicated();
                    full_update(h, s, rp);
                  },
                  h.failer());
        });
  }

  // Sharded slots are current only in their owner's segments: all-gather
  // them, one slot kind at a time (each is laid out like the variables).
  // Every replica is asked for its state at the same points of the job, so
  // the collectives match.
  void before_snapshot(replica_host& h, std::function<void()> k) override {
    if (!sharded_) {
      k();
      return;
    }
    if (wiring_.device_group)
      gather_device_slots(h, std::move(k));
    else
      gather_slots(h, 0, std::move(k));
  }

 private:
  // The update on the device; the device runs tasks in order, so the next
  // step's gradients may be queued right behind it: the reducer is done with
  // the buffers.
  void full_update(replica_host& h, step_stats s, step_promise rp) {
    h.on_device<int>(
        "optimizer_update",
        [](compute_state& cs) {
          cs.gradients_to_device();
          cs.apply_update();
          return 0;
        },
        [s, rp](int&) mutable { rp.deliver(s); });
    h.resume();
  }

  // ZeRO stage 1: reduce-scatter the gradients, update only this replica's
  // segments (1/N of the optimizer's work), all-gather the variables. The
  // next step's gradients wait for the all-gather: they read the variables.
  void sharded_update(replica_host& h, step_stats s, step_promise rp) {
    h.communicating("reduce_scatter");
    h.self()
        ->request(wiring_.reducer, h.request_timeout(), reduce_scatter_atom::value, reduce_op::sum,
                  h.gradient_buffers())
        .then(
            [this, &h, s, rp](std::vector<tensor>&) mutable {
              h.communicated();
              h.on_device<std::vector<tensor>>(
                  "optimizer_update",
                  [segments = segments_](compute_state& cs) {
                    cs.opt->apply_ranges(cs.net->variables(), cs.grads, *segments);
                    return variable_buffers(cs);
                  },
                  [this, &h, s, rp](std::vector<tensor>& vars) mutable {
                    h.communicating("all_gather");
                    h.self()
                        ->request(wiring_.reducer, h.request_timeout(), all_gather_atom::value,
                                  std::move(vars))
                        .then(
                            [&h, s, rp](std::vector<tensor>&) mutable {
                              h.communicated();
                              h.step_finished(rp, s);
                            },
                            h.failer());
                  });
            },
            h.failer());
  }

  void gather_slots(replica_host& h, std::size_t k, std::function<void()> done) {
    h.on_device<std::vector<tensor>>(
        "snapshot",
        [k](compute_state& cs) {
          return k < cs.opt->slot_names().size() ? cs.opt->slot_tensors(k) : std::vector<tensor>{};
        },
        [this, &h, k, done](std::vector<tensor>& slots) {
          if (slots.empty()) {
            done();
            return;
          }
          h.communicating("all_gather");
          h.self()
              ->request(wiring_.reducer, h.request_timeout(), all_gather_atom::value,
                        std::move(slots))
              .then(
                  [this, &h, k, done](std::vector<tensor>&) {
                    h.communicated();
                    gather_slots(h, k + 1, done);
                  },
                  h.failer());
        });
  }

  // Device work that aborts the group when it throws (then rethrows: the
  // replica ends with the error), so that the peers are not left waiting.
  template <class F>
  auto guarded(F f) {
    return [f = std::move(f), group = wiring_.device_group,
            index = wiring_.index](compute_state& cs) mutable {
      try {
        return f(cs);
      } catch (const std::exception& e) {
        group->abort("replica " + std::to_string(index) + ": " + e.what());
        throw;
      }
    };
  }

  // The device collectives' sharded slots, gathered on the devices.
  void gather_device_slots(replica_host& h, std::function<void()> k) {
    h.on_device<int>("snapshot_gather_slots", guarded([](compute_state& cs) {
                       for (std::size_t kind = 0; kind < cs.opt->slot_names().size(); ++kind) {
                         auto slots = cs.opt->slot_tensors(kind);
                         for (std::size_t i = 0; i < slots.size(); ++i)
                           if (splits(cs, *cs.collectives, i))
                             cs.collectives->all_gather(slots[i].f32(),
                                                        chunk_of(cs, *cs.collectives, i));
                       }
                       cs.collectives->check();
                       return 0;
                     }),
                     [k = std::move(k)](int&) { k(); });
  }

  // Gradients, their all-reduce on the device (in buckets of the fused
  // gradient block, so a large model's collective starts pipelining inside
  // NCCL as the reducer actors do with theirs), the update: one device task.
  // A failure anywhere aborts the group, so the peers fail too instead of
  // waiting in the collective.
  //
  // Across processes (hierarchical): the device all-reduce in the process,
  // then the process's first replica takes the sum through the CAF ring of
  // processes (host staging), then a second device all-reduce in which the
  // other replicas contribute zeros spreads the global sum to them.
  void device_collective_step(replica_host& h, int64_t step, batch b, step_promise rp) {
    auto epoch = b.epoch;
    // A global group (NCCL over every replica of the job) needs no ring.
    const bool across = wiring_.across_processes && !wiring_.device_group_global;
    h.set_busy(across);
    h.on_device<step_stats>(
        across ? "forward_backward_allreduce" : "forward_backward_allreduce_update",
        guarded([b = std::move(b), step, fail = h.fail_at_step(), across, bucket = bucket_floats(),
                 ring = static_cast<bool>(wiring_.ring), sharded = sharded_,
                 segments = segments_](compute_state& cs) {
          auto& comm = *cs.collectives;
          // Each layer's gradients are reduced as soon as backward has made
          // them, while the layers below are still to come: the collective
          // reads them hot from the cache, and on NCCL it is queued right
          // behind them. What the model did not report is reduced after.
          auto reduce = [&](std::size_t first, std::size_t last) {
            if (sharded)
              reduce_scatter_gradients(cs, comm, first, last);
            else
              all_reduce_gradients(cs, comm, bucket, first, last);
          };
          std::size_t unreduced = cs.grads.size();
          auto s =
              compute_gradients(cs, b, step, fail, false, [&](std::size_t first, std::size_t last) {
                if (last != unreduced) return;  // out of order: later
                reduce(first, last);
                unreduced = first;
              });
          reduce(0, unreduced);
          comm.check();
          if (sharded) {
            cs.opt->apply_ranges(cs.net->variables(), cs.grads, *segments);
            gather_variables(cs, comm);
          } else if (!across) {
            cs.apply_update();
          }
          if (ring) cs.gradients_to_host();
          return s;
        }),
        [this, &h, rp, epoch, across](step_stats& s) mutable {
          s.epoch = epoch;
          h.count(s);
          if (!across) {
            rp.deliver(s);
            return;
          }
          if (!wiring_.ring) {
            spread_and_update(h, s, rp);
            return;
          }
          h.communicating("ring_allreduce");
          h.self()
              ->request(wiring_.ring, h.request_timeout(), allreduce_atom::value, reduce_op::sum,
                        h.gradient_buffers())
              .then(
                  [this, &h, s, rp](std::vector<tensor>&) mutable {
                    h.communicated();
                    spread_and_update(h, s, rp);
                  },
                  [this, &h](caf::error& e) {
                    wiring_.device_group->abort(
                        "replica " + std::to_string(wiring_.index) +
                        ": the ring across processes failed: " + describe(e));
                    h.fail(e);
                  });
        });
  }

  // The second in-process all-reduce of a step across processes.
  void spread_and_update(replica_host& h, step_stats s, step_promise rp) {
    h.on_device<int>("allreduce_update",
                     guarded([bucket = bucket_floats(),
                              ring = static_cast<bool>(wiring_.ring)](compute_state& cs) {
                       if (ring)
                         cs.gradients_to_device();
                       else
                         zero_gradients(cs);
                       all_reduce_gradients(cs, *cs.collectives, bucket, 0, cs.grads.size());
                       cs.collectives->check();
                       cs.apply_update();
                       return 0;
                     }),
                     [&h, s, rp](int&) mutable { h.step_finished(rp, s); });
  }

  static void zero_gradients(compute_state& cs) {
    if (!cs.discrete()) {
      for (auto& g : cs.grads) g.value.fill(0.0f);
      return;
    }
    auto ptrs = cs.net->device_gradients();
    for (std::size_t i = 0; i < ptrs.size(); ++i)
      cs.dev->ops().fill(ptrs[i], 0.0f, static_cast<std::size_t>(cs.grads[i].value.numel()));
  }

  // The gradients of variables [first, last), in buckets of at most
  // `bucket` floats: one collective over the fused block where the model
  // keeps one (a discrete device), else one per variable.
  static void all_reduce_gradients(compute_state& cs, device_communicator& comm, std::size_t bucket,
                                   std::size_t first, std::size_t last) {
    if (first >= last) return;
    auto reduce = [&](float* p, std::size_t n) {
      for (std::size_t at = 0; at < n; at += bucket)
        comm.all_reduce(p + at, std::min(bucket, n - at), device_reduce::sum);
    };
    auto numel = [&](std::size_t i) { return static_cast<std::size_t>(cs.grads[i].value.numel()); };
    if (cs.discrete()) {
      auto ptrs = cs.net->device_gradients();
      if (cs.net->device_gradient_block()) {  // [first, last) is one run of the block
        std::size_t total = 0;
        for (std::size_t i = first; i < last; ++i) total += numel(i);
        reduce(ptrs[first], total);
        return;
      }
      for (std::size_t i = first; i < last; ++i) reduce(ptrs[i], numel(i));
      return;
    }
    for (std::size_t i = first; i < last; ++i) reduce(cs.grads[i].value.f32(), numel(i));
  }

  // ZeRO stage 1 on the device collectives (cpu devices, one process): a
  // variable whose size the replicas divide is reduce-scattered, updated in
  // this replica's chunk only and all-gathered; any other is all-reduced and
  // updated whole by every replica. Chunks follow the collectives' layout.
  static bool splits(compute_state& cs, device_communicator& comm, std::size_t i) {
    const auto n = cs.grads[i].value.numel();
    return comm.size() > 1 && n >= comm.size() && n % comm.size() == 0;
  }
  static std::size_t chunk_of(compute_state& cs, device_communicator& comm, std::size_t i) {
    return static_cast<std::size_t>(cs.grads[i].value.numel() / comm.size());
  }
  // The elements this replica updates, over the variables concatenated.
  static std::vector<std::pair<int64_t, int64_t>> device_shard_ranges(compute_state& cs,
                                                                      device_communicator& comm) {
    std::vector<std::pair<int64_t, int64_t>> out;
    int64_t at = 0;
    for (std::size_t i = 0; i < cs.grads.size(); ++i) {
      const int64_t n = cs.grads[i].value.numel();
      if (splits(cs, comm, i)) {
        const auto c = static_cast<int64_t>(chunk_of(cs, comm, i));
        out.emplace_back(at + comm.rank() * c, at + (comm.rank() + 1) * c);
      } else if (n > 0) {
        out.emplace_back(at, at + n);
      }
      at += n;
    }
    return out;
  }
  static void reduce_scatter_gradients(compute_state& cs, device_communicator& comm,
                                       std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i) {
      float* g = cs.grads[i].value.f32();
      if (splits(cs, comm, i))
        comm.reduce_scatter(g, chunk_of(cs, comm, i), device_reduce::sum);
      else
        comm.all_reduce(g, static_cast<std::size_t>(cs.grads[i].value.numel()), device_reduce::sum);
    }
  }
  static void gather_variables(compute_state& cs, device_communicator& comm) {
    auto& vars = cs.net->variables();
    for (std::size_t i = 0; i < vars.size(); ++i)
      if (splits(cs, comm, i)) comm.all_gather(vars[i].value.f32(), chunk_of(cs, comm, i));
    comm.check();
  }

  std::size_t bucket_floats() const {
    return std::max<std::size_t>(1, static_cast<std::size_t>(reducer_cfg_.bucket_bytes) / 4);
  }

  replica_wiring wiring_;
  bool sharded_;
  reducer_config reducer_cfg_;

  // This replica's reduce-scatter segments; written and read on the device.
  std::shared_ptr<std::vector<std::pair<int64_t, int64_t>>> segments_;
};

class mirrored final : public strategy {
 public:
  std::string name() const override { return "mirrored"; }
  void validate(const job_config& c) const override { check_global_batch_covers_replicas(c); }
  bool replicas_must_agree() const override { return true; }
  bool reduces_across_processes() const override { return true; }

  reducer_parts make_reducers(caf::actor_system& sys, const job_config& c,
                              const reducer_wiring& w) const override {
    reducer_parts out;
    if (c.strategy.reducer.algorithm == "nccl" && !w.device_group_id.empty()) {
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
    if (c.strategy.reducer.algorithm == "nccl") {
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
    if (c.strategy.reducer.algorithm != "nccl" || processes < 2 ||
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
    return std::make_unique<mirrored_step>(w, sharded, reducer_config_of(c));
  }
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
