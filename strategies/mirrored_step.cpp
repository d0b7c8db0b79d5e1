// mirrored's replica step: one, whatever runs the collectives. The replica
// holds a process_group (collectives/process_group.hpp) and the whole step
// is one device task; each layer's gradients are all-reduced as soon as
// backward has made them (in buckets, so a large model's collectives
// pipeline), while the layers below are still to come, then the update.
//
// One step, per replica:
//   coordinator --train(s)--> replica --(device: gradients, all-reduce per
//     layer, wait, update)--> reply
// With the optimizer sharded (ZeRO stage 1, cpu devices, one process):
// reduce-scatter per layer, update own chunks, all-gather the variables, in
// the same task; and before a snapshot the slots are all-gathered.
//
// The group, by strategy.reducer and where the replicas are:
//   algorithm "device", one process        the device group (NCCL; the host
//     or one NCCL group over the job        group on cpu:N and sim:N)
//   algorithm "device", across processes   hierarchical: the device group in
//                                           the process, the direct links
//                                           (transport "direct") or the ring
//                                           nodes ("actors") between them
//   ring, tree, reduce_to_one              the reducer actors (across
//                                           processes: hierarchical, the ring
//                                           nodes between the processes)
// A host-memory group (the actors) on a discrete device: the gradients are
// staged to the host after backward and back before the update.
//
// A replica that fails or stops aborts the group as it ends, so its peers
// fail too instead of waiting in a collective.
#include <algorithm>
#include <mutex>

#include "actors/failure.hpp"
#include "strategies/mirrored_steps.hpp"
#include "strategies/replica_group.hpp"
#include "trace/trace.hpp"

namespace troupe {
namespace {

// What aborts the replica's group, from the device thread (a step that
// throws) or the actor's (a replica that stops).
struct group_abort {
  std::shared_ptr<group_rendezvous> rendezvous;  // ranks yet to join fail too
  // The links too: a device thread waiting on another process must not keep
  // this one from ending (the peers then fail at once, their links closed).
  std::shared_ptr<process_group> links;
  std::mutex mtx;
  std::shared_ptr<process_group> group;  // under mtx: set on the device at init

  void operator()(const std::string& why) {
    if (rendezvous) rendezvous->abort(why);
    if (links) links->abort(why);
    std::lock_guard lock(mtx);
    if (group) group->stop_waiting(why);
  }
};

class mirrored_step final : public replica_step {
 public:
  mirrored_step(replica_wiring w, reducer_config rc, bool sharded)
      : wiring_(std::move(w)),
        bucket_(std::max<std::size_t>(1, static_cast<std::size_t>(rc.bucket_bytes) / 4)),
        sharded_(sharded),
        chunks_(std::make_shared<element_ranges>()),
        abort_(std::make_shared<group_abort>()) {
    abort_->rendezvous = wiring_.device_group;
    abort_->links = wiring_.process_links;
  }

  // A replica that fails or stops must not leave a device thread blocked
  // in a collective: the device groups (NCCL, the host group) end on every
  // rank; the reducer actors' group stops waiting on this rank only, and
  // the peers' waits end as their own replicas stop with the job. So the
  // job fails naming the replica that failed, not a peer an abort failed
  // in turn (a step that throws ends its replica, and so comes here).
  ~mirrored_step() override { (*abort_)(replica_stopped(wiring_.index)); }

  void init(compute_state& cs) override {
    cs.collectives = make_replica_group(wiring_, cs);
    {
      std::lock_guard lock(abort_->mtx);
      abort_->group = cs.collectives;
    }
    if (sharded_) *chunks_ = own_shard_ranges(cs, *cs.collectives);
  }

  // The replica is not held: the next step's task queues behind this one.
  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    h.set_busy(false);
    run_on_device(h, span, step, std::move(b), work(h), std::move(rp));
  }
  bool runs_executions() const override { return true; }
  void run_steps(replica_host& h, int64_t first, std::vector<batch> bs,
                 execution_promise rp) override {
    h.set_busy(false);
    run_on_device(h, span, first, std::move(bs), work(h), std::move(rp));
  }

  // Sharded slots are current only in their owner's chunks.
  void before_snapshot(replica_host& h, std::function<void()> k) override {
    if (!sharded_) {
      k();
      return;
    }
    h.on_device<int>(
        "snapshot_gather_slots",
        [](compute_state& cs) {
          gather_slots(cs, *cs.collectives);
          return 0;
        },
        [k = std::move(k)](int&) { k(); });
  }

 private:
  static constexpr const char* span = "forward_backward_allreduce_update";

  device_step_fn work(replica_host& h) {
    return [fail = h.fail_at_step(), bucket = bucket_, sharded = sharded_, chunks = chunks_,
            index = wiring_.index](compute_state& cs, const batch& b, int64_t step) {
      trace::note_step(index, step);  // the reducers label their spans with it
      cs.settle_variables();          // the last step's all-gather, in an execution of several
      auto& group = *cs.collectives;
      auto s = group.memory() == process_group::memory_kind::host && cs.discrete()
                   ? gradients_reduced_on_host(cs, group, b, step, fail)
                   : gradients_reduced_in_backward(
                         cs, b, step, fail, [&](std::size_t first, std::size_t last) {
                           if (sharded)
                             reduce_scatter_gradients(cs, group, first, last);
                           else
                             all_reduce_gradients(cs, group, bucket, first, last);
                         });
      group.complete();
      if (sharded) {
        cs.opt->apply_ranges(cs.net->variables(), cs.grads, *chunks);
        gather_variables(cs, group);
      } else {
        if (group.memory() == process_group::memory_kind::host) cs.gradients_to_device();
        cs.apply_update();
      }
      return s;
    };
  }

  replica_wiring wiring_;
  std::size_t bucket_;  // floats per all-reduce: the reducer's bucket size
  bool sharded_;
  // This replica's chunks (sharded); written and read on the device.
  std::shared_ptr<element_ranges> chunks_;
  std::shared_ptr<group_abort> abort_;
};

}  // namespace

std::unique_ptr<replica_step> make_mirrored_step(replica_wiring w, reducer_config rc,
                                                 bool sharded) {
  return std::make_unique<mirrored_step>(std::move(w), rc, sharded);
}

}  // namespace troupe
