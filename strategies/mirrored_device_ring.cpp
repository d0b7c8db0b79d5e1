// mirrored on device collectives across processes (hierarchical): a device
// all-reduce in the process, then the process's first replica takes the sum
// around the ring of processes (staged to the host), then a second device
// all-reduce, in which the other replicas contribute zeros, spreads the
// global sum to them, and every replica updates.
//
// Around the ring: over the process's direct links (strategy.reducer.
// transport "direct", runtime/process_ring.hpp), still in the device task
// that made the gradients; or through the CAF ring node ("actors").
//
// One step, per replica:
//   coordinator --train(s)--> replica --(device: gradients, all-reduce per layer)
//     first replica, direct:  (device: ... then the links' all-reduce)
//                               --> (device: all-reduce, update)
//     first replica, actors:  --allreduce(sum)--> ring node --> (device: all-reduce, update)
//     the others:     (device: zeros, all-reduce, update)
//   --> reply
#include "strategies/mirrored_steps.hpp"

namespace troupe {
namespace {

class mirrored_device_ring_step final : public device_group_step {
 public:
  using device_group_step::device_group_step;

  // The replica is held until the update: its gradients are in the ring.
  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    h.set_busy(true);
    auto epoch = b.epoch;
    step_on_device(
        h, "forward_backward_allreduce", epoch,
        guarded([b = std::move(b), step, fail = h.fail_at_step(), bucket = bucket_floats(),
                 ring = has_ring(), links = wiring_.process_links](compute_state& cs) {
          auto& comm = *cs.collectives;
          auto s = gradients_reduced_in_backward(
              cs, b, step, fail, [&](std::size_t first, std::size_t last) {
                all_reduce_gradients(cs, comm, bucket, first, last);
              });
          comm.complete();
          if (ring) cs.gradients_to_host();
          if (ring && links) all_reduce_over_links(cs, *links);
          return s;
        }),
        [this, &h, rp](step_stats& s) {
          if (has_ring() && !wiring_.process_links)
            ring_all_reduce(h, s, rp);
          else
            spread_and_update(h, s, rp);
        });
  }

 private:
  bool has_ring() const { return static_cast<bool>(wiring_.ring); }

  // The process's sum (on the host) summed with the other processes', as one
  // collective over every gradient. A link that fails aborts the device
  // group too (guarded), so the process's other replicas do not wait.
  static void all_reduce_over_links(compute_state& cs, device_communicator& links) {
    std::vector<float_span> spans;
    spans.reserve(cs.grads.size());
    for (auto& g : cs.grads)
      spans.push_back({g.value.f32(), static_cast<std::size_t>(g.value.numel())});
    links.all_reduce_spans(spans, reduce_op::sum);
  }

  void ring_all_reduce(replica_host& h, const step_stats& s, step_promise rp) {
    collective(
        h, "ring_allreduce", [this, &h, s, rp] { spread_and_update(h, s, rp); },
        [this, &h](caf::error& e) {
          wiring_.device_group->abort("replica " + std::to_string(wiring_.index) +
                                      ": the ring across processes failed: " + describe(e));
          h.fail(e);
        },
        wiring_.ring, allreduce_atom::value, reduce_op::sum, h.gradient_buffers());
  }

  // The second in-process all-reduce.
  void spread_and_update(replica_host& h, const step_stats& s, step_promise rp) {
    h.on_device<int>("allreduce_update",
                     guarded([bucket = bucket_floats(), ring = has_ring()](compute_state& cs) {
                       if (ring)
                         cs.gradients_to_device();
                       else
                         zero_gradients(cs);
                       all_reduce_gradients(cs, *cs.collectives, bucket, 0, cs.grads.size());
                       cs.collectives->complete();
                       cs.apply_update();
                       return 0;
                     }),
                     [&h, s, rp](int&) mutable { h.step_finished(rp, s); });
  }
};

}  // namespace

std::unique_ptr<replica_step> make_mirrored_device_ring_step(replica_wiring w, reducer_config rc) {
  return std::make_unique<mirrored_device_ring_step>(std::move(w), rc);
}

}  // namespace troupe
