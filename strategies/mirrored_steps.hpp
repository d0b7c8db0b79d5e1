#pragma once
// The mirrored strategy's replica steps, one class per protocol (each drawn
// in its file), and what they share. strategies/mirrored.cpp picks one:
//
//   reducer actors  (mirrored_allreduce.cpp)    all-reduce, then the whole update
//                   (mirrored_zero.cpp)         ZeRO stage 1: reduce-scatter, the
//                                               own segments' update, all-gather
//   device group    (mirrored_device.cpp)       reduced during backward, updated
//                                               (whole or ZeRO-1): one device task
//                   (mirrored_device_ring.cpp)  across processes: in the process,
//                                               the ring of processes, back
//
// Private to the mirrored strategy's files (and bench/compute_threads.hpp,
// which times the ZeRO-1 protocol alone).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strategies/strategy.hpp"

namespace troupe {

using element_ranges = std::vector<std::pair<int64_t, int64_t>>;

std::unique_ptr<replica_step> make_mirrored_allreduce_step(replica_wiring w);
std::unique_ptr<replica_step> make_mirrored_zero_step(replica_wiring w, reducer_config rc);
std::unique_ptr<replica_step> make_mirrored_device_step(replica_wiring w, reducer_config rc,
                                                        bool sharded);
std::unique_ptr<replica_step> make_mirrored_device_ring_step(replica_wiring w, reducer_config rc);

// A step's device task `work` (named `span` in a trace) on a batch of
// `epoch`; then, on the actor, `then` with the step's figures, counted
// toward the training metrics.
void step_on_device(replica_host& h, const char* span, int64_t epoch,
                    std::function<step_stats(compute_state&)> work,
                    std::function<void(step_stats&)> then);

// A collective through an actor (a reducer, the ring node) on `args`: the
// replica's track shows `what` until the answer, then `then` runs on the
// actor; `on_error` instead when it fails.
template <class Actor, class... Args>
void collective(replica_host& h, const char* what, std::function<void()> then,
                std::function<void(caf::error&)> on_error, const Actor& to, Args&&... args) {
  h.communicating(what);
  h.self()
      ->request(to, h.request_timeout(), std::forward<Args>(args)...)
      .then(
          [&h, then = std::move(then)](std::vector<tensor>&) {
            h.communicated();
            then();
          },
          std::move(on_error));
}

// --- the reducer actors' steps ---

// The step's gradients on the device (scaled 1/global batch, so that the
// reducers' sum is the mean), staged to the host for the reducer; then, on
// the actor, `then` with the step's figures, counted.
void gradients_for_reducer(replica_host& h, int64_t step, batch b,
                           std::function<void(step_stats&)> then);

// --- the device collectives' steps ---

// A replica in a device collective group: it joins the group at init, and
// leaving ends the group's collectives on every rank (a replica that fails
// or stops must not leave its peers blocked in one).
class device_group_step : public replica_step {
 public:
  device_group_step(replica_wiring w, reducer_config rc);
  ~device_group_step() override;
  void init(compute_state& cs) override;

 protected:
  // Device work that aborts the group when it throws (then rethrows: the
  // replica ends with the error), so that the peers are not left waiting.
  template <class F>
  auto guarded(F f) {
    return [f = std::move(f), group = wiring_.device_group, links = wiring_.process_links,
            index = wiring_.index](compute_state& cs, auto&&... args) mutable {
      try {
        return f(cs, std::forward<decltype(args)>(args)...);
      } catch (const std::exception& e) {
        const std::string why = "replica " + std::to_string(index) + ": " + e.what();
        group->abort(why);
        if (links) links->abort(why);
        throw;
      }
    };
  }
  // Floats per all-reduce: the reducer's bucket size.
  std::size_t bucket_floats() const;

  replica_wiring wiring_;
  reducer_config reducer_cfg_;
};

// The step's gradients (scaled 1/global batch) with `reduce(first, last)`
// called on each range of variables as soon as backward has made their
// gradients, while the layers below are still to come: the collective reads
// them hot from the cache, and on NCCL it is queued right behind them. What
// the model did not report in order is reduced after. On the device thread.
step_stats gradients_reduced_in_backward(
    compute_state& cs, const batch& b, int64_t step, int64_t fail_at_step,
    const std::function<void(std::size_t, std::size_t)>& reduce);

// The gradients of variables [first, last) summed over the group, in
// collectives of at most `bucket` floats: one over the fused block where the
// model keeps one (a discrete device), else one per variable. Issued: the
// sums are in the gradients after comm.complete().
void all_reduce_gradients(compute_state& cs, device_communicator& comm, std::size_t bucket,
                          std::size_t first, std::size_t last);
void zero_gradients(compute_state& cs);

// ZeRO stage 1 on the device collectives (cpu devices, one process): a
// variable whose size the replicas divide is reduce-scattered, updated in
// this replica's chunk only and all-gathered; any other is all-reduced and
// updated whole by every replica. Chunks follow the collectives' layout.
//
// The elements this replica updates, over the variables concatenated.
element_ranges device_shard_ranges(compute_state& cs, device_communicator& comm);
// Issued, like all_reduce_gradients: this replica's chunks are reduced
// after comm.complete().
void reduce_scatter_gradients(compute_state& cs, device_communicator& comm, std::size_t first,
                              std::size_t last);
// Both gathers complete before they return.
void gather_variables(compute_state& cs, device_communicator& comm);
// Every kind of optimizer slot (each laid out like the variables).
void gather_slots(compute_state& cs, device_communicator& comm);

}  // namespace troupe
