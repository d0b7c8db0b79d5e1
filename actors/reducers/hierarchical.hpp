#pragma once
// Hierarchical all-reduce for mirrored training across processes: the
// replicas of a process reduce through their in-process group
// (spawn_reducer_group: shared memory, no copies), only local rank 0 of each
// process joins the cross-process ring (remote_ring.hpp: one ring node per
// process), and rank 0 then broadcasts the result inside its process. The
// network carries one buffer per process instead of one per replica.
//
// Every replica gets its own hierarchical reducer (a reducer_actor, so a
// replica uses it like any other reducer). Per allreduce(op, tensors), in
// place on the caller's tensors:
//   1. local all-reduce on `local` (sum for sum and mean, min/max as is);
//   2. local rank 0 only: ring all-reduce of the same op over `ring`;
//   3. local broadcast from rank 0 on `local`;
//   4. mean: every float times 1/global_replicas (the same float operation on
//      bit-identical inputs, so every replica of every process ends
//      bit-identical).
//
// Failures: every rank always runs every stage, so the local group and the
// ring stay matched collective by collective whatever failed. A status float
// rides along with the ring (and the broadcast): a failure anywhere (a local
// stage in any process, or the ring) makes every replica of every process
// get an error reply for that collective, saying which stage failed, e.g.
// "hierarchical all-reduce: ring stage: <reason>" (the ring's own reasons
// count one element more than the caller's tensors: the status float). A
// local mismatch leaves the groups usable; a ring failure breaks the ring,
// so later collectives fail too (build new groups to go on). A stage that
// times out (cfg.timeout) or a local reducer that dies leaves this reducer
// broken: it fails what is queued and every later call at once. After an
// error the caller's tensors hold unspecified values.
//
// Collectives are serialized per reducer: a call arriving while one is in
// flight waits its turn (every stage must run in the same order on all
// ranks). Every rank of every process must call with the same number and
// sizes of float32 tensors and the same op, in the same order.
//
// Only allreduce crosses processes: broadcast, reduce_scatter and all_gather
// get an error reply (the mirrored replica uses them only with
// shard_optimizer, which callers turn off across processes). stats_atom
// replies with this reducer's own counters (collectives, failed,
// bytes_reduced; buckets and messages_sent belong to the stage reducers and
// stay 0).
#include <chrono>
#include <cstdint>

#include <caf/all.hpp>

#include "messages/protocols.hpp"
#include "messages/remote_ring_messages.hpp"

namespace troupe {

struct hierarchical_config {
  // This replica's reducer in its process's in-process group.
  reducer_actor local;
  // Rank in the local group; rank 0 talks to the ring.
  int32_t local_rank = 0;
  // This process's ring node: used on local rank 0 only; null (single
  // process) skips the ring stage.
  ring_node_actor ring;
  // Replicas over all processes (mean divides by this).
  int64_t global_replicas = 1;
  // Every request to `local` and `ring`.
  caf::timespan timeout = std::chrono::seconds(120);
  // What each ring rank is (e.g. the task "worker:1"), so that a failure
  // names the process rather than a rank number; may be empty.
  std::vector<std::string> ring_names;
};

// Throws std::invalid_argument for a null local reducer, a negative local
// rank or global_replicas < 1.
reducer_actor spawn_hierarchical_reducer(caf::actor_system& sys, hierarchical_config cfg);

}  // namespace troupe
