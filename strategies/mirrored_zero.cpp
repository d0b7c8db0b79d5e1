// mirrored with the optimizer sharded over the replicas (ZeRO stage 1:
// strategy.shard_optimizer, in one process over reducer actors): the
// gradients are reduce-scattered, every replica updates only its own
// segments (1/N of the optimizer's work), and the variables are all-gathered.
//
// One step, per replica:
//   coordinator --train(s)--> replica --(device: gradients, scaled 1/global batch)
//     --reduce_scatter(sum)--> reducer --> (device: update own segments)
//     --all_gather(variables)--> reducer --> reply
// Before a snapshot, every kind of optimizer slot is all-gathered the same way.
#include "strategies/mirrored_steps.hpp"

namespace troupe {
namespace {

class mirrored_zero_step final : public replica_step {
 public:
  mirrored_zero_step(replica_wiring w, reducer_config rc)
      : wiring_(std::move(w)), reducer_cfg_(rc), segments_(std::make_shared<element_ranges>()) {}

  void init(compute_state& cs) override {
    int64_t numel = 0;
    for (auto& g : cs.grads) numel += g.value.numel();
    *segments_ = reduce_scatter_segments(numel, reducer_cfg_, static_cast<int>(wiring_.replicas),
                                         static_cast<int>(wiring_.index));
  }

  // The next step's gradients wait for the all-gather: they read the
  // variables.
  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    h.set_busy(true);
    gradients_for_reducer(h, step, std::move(b),
                          [this, &h, rp](step_stats& s) { reduce_scatter(h, s, rp); });
  }

  // Sharded slots are current only in their owner's segments. Every replica
  // is asked for its state at the same points of the job, so the
  // collectives match.
  void before_snapshot(replica_host& h, std::function<void()> k) override {
    gather_slots(h, 0, std::move(k));
  }

 private:
  void reduce_scatter(replica_host& h, const step_stats& s, step_promise rp) {
    collective(
        h, "reduce_scatter", [this, &h, s, rp] { update_own_segments(h, s, rp); }, h.failer(),
        wiring_.reducer, reduce_scatter_atom::value, reduce_op::sum, h.gradient_buffers());
  }

  void update_own_segments(replica_host& h, const step_stats& s, step_promise rp) {
    h.on_device<std::vector<tensor>>(
        "optimizer_update",
        [segments = segments_](compute_state& cs) {
          cs.opt->apply_ranges(cs.net->variables(), cs.grads, *segments);
          return variable_buffers(cs);
        },
        [this, &h, s, rp](std::vector<tensor>& vars) {
          collective(
              h, "all_gather", [&h, s, rp]() mutable { h.step_finished(rp, s); }, h.failer(),
              wiring_.reducer, all_gather_atom::value, std::move(vars));
        });
  }

  // Slot kind k and the ones after it, one all-gather each.
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
          collective(
              h, "all_gather", [this, &h, k, done] { gather_slots(h, k + 1, done); }, h.failer(),
              wiring_.reducer, all_gather_atom::value, std::move(slots));
        });
  }

  replica_wiring wiring_;
  reducer_config reducer_cfg_;
  // This replica's reduce-scatter segments; written and read on the device.
  std::shared_ptr<element_ranges> segments_;
};

}  // namespace

std::unique_ptr<replica_step> make_mirrored_zero_step(replica_wiring w, reducer_config rc) {
  return std::make_unique<mirrored_zero_step>(std::move(w), rc);
}

}  // namespace troupe
