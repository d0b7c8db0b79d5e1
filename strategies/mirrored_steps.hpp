#pragma once
// What mirrored's replica step (strategies/mirrored_step.cpp) does on the
// device thread with its process_group: gradients reduced per layer during
// backward, or staged to the host for a host-memory group; ZeRO stage 1's
// layout (a variable the ranks divide is reduce-scattered in chunks, each
// rank updates its own, then all-gathered). Private to mirrored's files and
// bench/compute_threads.hpp, which times the ZeRO-1 protocol alone.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strategies/strategy.hpp"

namespace troupe {

using element_ranges = std::vector<std::pair<int64_t, int64_t>>;

std::unique_ptr<replica_step> make_mirrored_step(replica_wiring w, reducer_config rc, bool sharded);

// The step's gradients (scaled 1/global batch) with `reduce(first, last)`
// called on each range of variables as soon as backward has made their
// gradients, while the layers below are still to come: the collective reads
// them hot from the cache, and on NCCL it is queued right behind them. What
// the model did not report in order is reduced after. On the device thread.
step_stats gradients_reduced_in_backward(
    compute_state& cs, const batch& b, int64_t step, int64_t fail_at_step,
    const std::function<void(std::size_t, std::size_t)>& reduce);

// The step's gradients (scaled 1/global batch) made on a discrete device,
// staged to the host and summed over a group in host memory (the reducer
// actors) as one collective. On the device thread.
step_stats gradients_reduced_on_host(compute_state& cs, process_group& group, const batch& b,
                                     int64_t step, int64_t fail_at_step);

// The gradients of variables [first, last) summed over the group, in
// collectives of at most `bucket` floats, one variable after another from
// the last (so every rank issues the same ones whatever ranges its backward
// reported). Issued: the sums are in the gradients after comm.complete().
void all_reduce_gradients(compute_state& cs, process_group& comm, std::size_t bucket,
                          std::size_t first, std::size_t last);

// ZeRO stage 1 (cpu devices, one process) in the group's own layout
// (process_group::shard_ranges: on the device collectives a chunk per rank
// of each variable the replicas divide, the others all-reduced and updated
// whole by every replica; on the reducer actors their segments).
//
// The elements this replica updates, over the variables concatenated.
element_ranges own_shard_ranges(compute_state& cs, process_group& comm);
// Issued, like all_reduce_gradients: this replica's chunks are reduced
// after comm.complete().
void reduce_scatter_gradients(compute_state& cs, process_group& comm, std::size_t first,
                              std::size_t last);
// The variables' gather is left in flight where the group completes it on
// its own (compute_state::variables_in_flight: the next reader completes
// it), else completes before it returns, as the slots' always does.
void gather_variables(compute_state& cs, process_group& comm);
// Every kind of optimizer slot (each laid out like the variables).
void gather_slots(compute_state& cs, process_group& comm);

}  // namespace troupe
