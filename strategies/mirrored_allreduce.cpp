// mirrored over reducer actors: every replica's gradients are summed by its
// reducer (actors/reducer.hpp; across processes the hierarchical reducer: in
// the process, then a ring of processes, then back), and every replica
// applies the whole update.
//
// One step, per replica:
//   coordinator --train(s)--> replica --(device: gradients, scaled 1/global batch)
//     --allreduce(sum)--> reducer --> (device: update) --> reply
// On a discrete device the gradients are staged to the host for the
// reducer and back for the update.
#include "strategies/mirrored_steps.hpp"

namespace troupe {
namespace {

class mirrored_allreduce_step final : public replica_step {
 public:
  explicit mirrored_allreduce_step(replica_wiring w) : wiring_(std::move(w)) {}

  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    h.set_busy(true);
    gradients_for_reducer(h, step, std::move(b),
                          [this, &h, rp](step_stats& s) { all_reduce(h, s, rp); });
  }

 private:
  // The sum: every replica scaled its gradients by 1/global batch, so it is
  // the mean over the global batch.
  void all_reduce(replica_host& h, const step_stats& s, step_promise rp) {
    collective(
        h, "all_reduce", [this, &h, s, rp] { update(h, s, rp); }, h.failer(), wiring_.reducer,
        allreduce_atom::value, reduce_op::sum, h.gradient_buffers());
  }

  // The device runs tasks in order, so the next step's gradients may be
  // queued right behind the update: the reducer is done with the buffers.
  void update(replica_host& h, step_stats s, step_promise rp) {
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

  replica_wiring wiring_;
};

}  // namespace

std::unique_ptr<replica_step> make_mirrored_allreduce_step(replica_wiring w) {
  return std::make_unique<mirrored_allreduce_step>(std::move(w));
}

}  // namespace troupe
