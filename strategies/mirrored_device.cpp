// mirrored on device collectives (strategy.reducer.algorithm "device";
// devices/device_communicator.hpp: NCCL on cuda:N, an in-process equivalent
// on cpu:N and sim:N), over the replicas of one process or, with one NCCL
// group over every replica of the job, of all processes. The whole step is
// one device task, and the gradients never leave the device: each layer's
// gradients are reduced as soon as backward has made them (in buckets of the
// fused gradient block, so a large model's collective pipelines inside
// NCCL), then the update.
//
// One step, per replica:
//   coordinator --train(s)--> replica --(device: gradients, all-reduce per
//     layer, update)--> reply
// With the optimizer sharded (ZeRO stage 1, cpu devices): reduce-scatter per
// layer, update own chunks, all-gather the variables, in the same task; and
// before a snapshot the slots are all-gathered on the devices.
//
// A failure anywhere aborts the group, so the peers fail too instead of
// waiting in the collective.
#include "strategies/mirrored_steps.hpp"

namespace troupe {
namespace {

class mirrored_device_step final : public device_group_step {
 public:
  mirrored_device_step(replica_wiring w, reducer_config rc, bool sharded)
      : device_group_step(std::move(w), rc),
        sharded_(sharded),
        chunks_(std::make_shared<element_ranges>()) {}

  void init(compute_state& cs) override {
    device_group_step::init(cs);
    if (sharded_) *chunks_ = device_shard_ranges(cs, *cs.collectives);
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
    h.on_device<int>("snapshot_gather_slots", guarded([](compute_state& cs) {
                       gather_slots(cs, *cs.collectives);
                       return 0;
                     }),
                     [k = std::move(k)](int&) { k(); });
  }

 private:
  static constexpr const char* span = "forward_backward_allreduce_update";

  device_step_fn work(replica_host& h) {
    return guarded([fail = h.fail_at_step(), bucket = bucket_floats(), sharded = sharded_,
                    chunks = chunks_](compute_state& cs, const batch& b, int64_t step) {
      auto& comm = *cs.collectives;
      auto s = gradients_reduced_in_backward(
          cs, b, step, fail, [&](std::size_t first, std::size_t last) {
            if (sharded)
              reduce_scatter_gradients(cs, comm, first, last);
            else
              all_reduce_gradients(cs, comm, bucket, first, last);
          });
      comm.complete();
      if (sharded) {
        cs.opt->apply_ranges(cs.net->variables(), cs.grads, *chunks);
        gather_variables(cs, comm);
      } else {
        cs.apply_update();
      }
      return s;
    });
  }

  bool sharded_;
  // This replica's chunks (sharded); written and read on the device.
  std::shared_ptr<element_ranges> chunks_;
};

}  // namespace

std::unique_ptr<replica_step> make_mirrored_device_step(replica_wiring w, reducer_config rc,
                                                        bool sharded) {
  return std::make_unique<mirrored_device_step>(std::move(w), rc, sharded);
}

}  // namespace troupe
