#pragma once
// reducer_group: the reducer actors as a backend of the collective layer
// (collectives/process_group.hpp). Rank r's process_group sends each
// collective to its reducer actor (actors/reducer.hpp: ring, tree,
// reduce_to_one in one process; a process's ring node across processes,
// under the hierarchical composite) and its work completes with the actor's
// reply. So a strategy drives the actors from a replica's device thread
// exactly as it drives NCCL or the host group: issue per layer while
// backward runs, wait once, update.
//
// The calls come from one thread (the device thread of the rank) through a
// blocking actor of the group's own: a request is a message to the reducer
// holding the caller's buffers (no copy: a tensor over them, or over an
// aligned copy where a buffer does not start on 64 bytes), the reply comes
// back to that actor, and wait() receives the replies. Issued collectives
// of one kind are batched into one request (the reducer fuses its tensors
// into its own buckets) until the batch holds coalesce_bytes or a wait
// comes, as DDP fills its buckets: a step's per-layer all-reduces cost one
// collective of the actors.
//
// reduce_scatter and all_gather keep the interface's layout (rank r's chunk
// r): a reduce_scatter is an all-reduce of the whole buffer (every chunk
// reduced, the others' too) and an all_gather an all-reduce of the rank's
// own chunk and zeros elsewhere (exact), so that they batch with the rest.
// The reducers' own layouts (reduce_scatter_segments) serve callers that
// speak to the actors directly.
//
// Failure: a reducer's error, a peer's death or a timeout fails the
// collective with device_error naming the reducer and the cause. abort()
// (any thread) tells this rank's reducer that the rank leaves (the peers'
// reducers fail the collective they wait in, naming it, and every later
// one at once) and wakes this rank's waiting thread at once. The survivors then spawn a new reducer
// group over themselves.
//
// Buffers outlive a wait that an abort ends: a peer's reducer may still read
// this rank's buffers until it hears of the abort (stop_waiting does not even
// tell it), after the caller has stopped and freed them. So a request holds
// each buffer's owner (reducer_group_options::buffer_owners): the memory goes
// when the last reducer that can touch it lets go. A caller that names no
// owner keeps its buffers alive until every rank has finished the collective.
#include <functional>
#include <memory>
#include <string>

#include <caf/all.hpp>

#include "collectives/process_group.hpp"
#include "messages/protocols.hpp"
#include "messages/remote_ring_messages.hpp"

namespace troupe {

using buffer_owner_fn =
    std::function<std::shared_ptr<const void>(const float* data, std::size_t n)>;

struct reducer_group_options {
  int rank = 0;
  int size = 1;
  // A collective whose reply has not come by then fails (a lost peer that
  // no monitor reports).
  caf::duration timeout = caf::infinite;
  // The reducers' bucket_bytes (strategy.reducer.bucket_bytes): issued
  // collectives are batched into one request per kind until they hold this
  // many bytes or are waited for, and ZeRO-1's segments are laid out by it.
  std::size_t coalesce_bytes = std::size_t{4} << 20;
  // How abort() tells the actor that this rank leaves; null: a reducer's
  // `reduce_abort(reason)` (its peers fail their collectives too).
  std::function<void(const caf::actor&, const std::string&)> tell_abort;
  // What keeps a buffer the caller issues alive: the owner of the memory
  // [data, data + n), or null when it knows none. Called on the calling
  // thread, at each issue.
  buffer_owner_fn buffer_owners;
};

// `reducer` speaks allreduce, reduce_scatter, all_gather and broadcast
// (a reducer_actor); any actor that answers `allreduce(op, tensors)` with
// the tensors (a ring node) serves all-reduce only.
std::unique_ptr<process_group> make_reducer_group(caf::actor_system& sys, caf::actor reducer,
                                                  reducer_group_options opts);

// A process's ring node (actors/reducers/remote_ring.hpp) as the group of
// the processes (all-reduce only): rank `rank` of `size` processes. Its
// abort fails the node's pending work and tells the other nodes.
std::unique_ptr<process_group> make_ring_node_group(const ring_node_actor& node, int rank, int size,
                                                    caf::duration timeout,
                                                    buffer_owner_fn buffer_owners = {});

}  // namespace troupe
