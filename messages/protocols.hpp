#pragma once
// Every protocol between troupe's actors, as typed_actor aliases: sending a
// message an actor does not speak fails at compile time.
#include <caf/all.hpp>

#include "messages/messages.hpp"

namespace troupe {

// input_pipeline: hands out this replica's slices of global batches, in order,
// with `data.prefetch` batches prepared ahead.
using input_pipeline_actor = caf::typed_actor<caf::replies_to<next_atom>::with<batch>,
                                              // Internal: the device gathered task `ticket`.
                                              caf::reacts_to<computed_atom, uint64_t>>;

// replica: one device, one copy of the model and optimizer.
using replica_actor = caf::typed_actor<
    // Run training step `step` on the next batch from the pipeline.
    caf::replies_to<train_atom, int64_t>::with<step_stats>,
    // An execution: steps [first, first + count) on the next count batches,
    // their figures in step order (training.steps_per_execution).
    caf::replies_to<train_atom, int64_t, int64_t>::with<std::vector<step_stats>>,
    // Evaluate on (x, y) with the current variables.
    caf::replies_to<eval_atom, tensor, tensor>::with<metric_sums>,
    // Read (and, if the flag is set, reset) the accumulated training metrics:
    // sync-on-read, as tf.distribute's ON_READ variables.
    caf::replies_to<metrics_atom, bool>::with<metric_sums>,
    // Snapshot of variables and optimizer slots (clones).
    caf::replies_to<state_atom>::with<model_state>,
    // Replace variables and slots from a snapshot (checkpoint restore).
    caf::replies_to<restore_atom, model_state>::with<int64_t>,
    // Internal: the device finished task `ticket`.
    caf::reacts_to<computed_atom, uint64_t>>;

// reducer: one per replica; all-reduce and broadcast across the group that
// actors/reducer.hpp's spawn_reducer_group() wires (all in one process).
using reducer_actor = caf::typed_actor<
    // Collective all-reduce of the caller's float32 tensors IN PLACE (the
    // buffers are shared with the caller, nothing is copied through messages);
    // replies with the same tensors once this rank's result is in and no peer
    // reads its buffers any more. Every rank calls with the same number,
    // shapes and dtype of tensors, in the same order of collectives; a mismatch
    // is an error reply on every rank.
    caf::replies_to<allreduce_atom, reduce_op, std::vector<tensor>>::with<std::vector<tensor>>,
    // The two halves of a ring all-reduce (ZeRO-style sharded updates): after
    // a reduce-scatter, this rank's segments (reduce_scatter_segments() in
    // actors/reducer.hpp) hold the reduction and the rest is unspecified;
    // an all-gather copies every rank's segments into every rank's tensors.
    caf::replies_to<reduce_scatter_atom, reduce_op, std::vector<tensor>>::with<std::vector<tensor>>,
    caf::replies_to<all_gather_atom, std::vector<tensor>>::with<std::vector<tensor>>,
    // Collective broadcast from rank `root` into every rank's tensors, in place.
    caf::replies_to<broadcast_atom, int32_t, std::vector<tensor>>::with<std::vector<tensor>>,
    // This rank's counters.
    caf::replies_to<stats_atom>::with<reducer_stats>,
    // Reducer to reducer: a step of a collective is ready (see reduce_peer_msg).
    caf::reacts_to<reduce_peer_atom, reduce_peer_msg>,
    // Reducer to reducer: collective `seq` fails (sender rank, reason); every
    // rank answers with its own abort before it replies with the error.
    caf::reacts_to<reduce_abort_atom, uint64_t, int32_t, std::string>,
    // From the rank's owner (actors/reducer_group.hpp): this rank leaves the
    // group for `reason`. It tells its peers (reduce_left), and from then on
    // every collective of the group fails at once on every rank.
    caf::reacts_to<reduce_abort_atom, std::string>,
    // Reducer to reducer: rank `from` left the group for `reason`; it takes
    // part in no collective any more.
    caf::reacts_to<reduce_left_atom, int32_t, std::string>>;

}  // namespace troupe

namespace troupe {

// variable_shard (actors/variable_shard.hpp): owns some pieces of the
// variables (actors/partitioner.hpp) and their optimizer slots; workers pull
// values and push gradients, and never wait on each other through it (a
// reply comes when the work is done; the caller goes on meanwhile).
using variable_shard_actor = caf::typed_actor<
    // Values of the named pieces (empty list = all, in the shard's order) at
    // the current version. Later updates never change what a puller got.
    caf::replies_to<pull_atom, std::vector<std::string>>::with<shard_values>,
    // (worker, worker_step, based_on_version, grads): gradients for every
    // piece of the shard, any order, computed from values of version
    // based_on_version. Async mode: applied on arrival. Aggregate mode: summed
    // with the other contributors' pushes of the same worker_step and applied
    // once when all have arrived. Replies with the version after the apply
    // that included it; an error naming the piece on a mismatch.
    caf::replies_to<push_atom, int64_t, int64_t, int64_t, std::vector<named_tensor>>::with<int64_t>,
    // (worker, round, based_on_version, deltas): elastic averaging's exchange
    // with the center c that a center shard holds: every piece becomes
    // c + d, d = moving_rate (x - c) as the worker computed it (it subtracts
    // the same d from its own copy). Its own message, not a gradient: no
    // optimizer runs, and only a center shard takes it (a gradient shard
    // refuses it, a center shard refuses pushes). Async mode: applied on
    // arrival; aggregate mode: a round's deltas are summed and applied once,
    // and a late one (its round applied without it, when a worker was lost)
    // is applied alone, since exchanges add up. Replies as push does.
    caf::replies_to<exchange_atom, int64_t, int64_t, int64_t,
                    std::vector<named_tensor>>::with<int64_t>,
    // Contributors per step (0 = async). Replies with the previous value; a
    // pending step that now has enough pushes is applied.
    caf::replies_to<aggregate_atom, int64_t>::with<int64_t>,
    // Checkpoint: pieces, slots, version (a consistent snapshot).
    caf::replies_to<state_atom>::with<shard_state>,
    // Replace pieces, slots and version; replies with the version. Pending
    // aggregate steps fail.
    caf::replies_to<restore_atom, shard_state>::with<int64_t>,
    caf::replies_to<stats_atom>::with<shard_stats>>;

}  // namespace troupe
