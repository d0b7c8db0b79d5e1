#pragma once
// hierarchical_group: one group over the replicas of several processes, made
// of two (Horovod's and NCCL's hierarchical all-reduce): `local`, the
// replicas of this process (NCCL, the host group, reducer actors), and, for
// the process's first replica only, `across`, a group of the processes (the
// process ring's sockets, or the ring nodes through a reducer group).
//
// An all-reduce: every replica issues it in the process as usual (so a
// step's buckets still overlap its backward); at complete() the process's
// sum is final, the first replica takes it around the processes (one
// collective over every buffer issued since the last complete(), staged to
// the host where the local group's memory is a discrete device's), and a
// broadcast in the process from the first replica brings the job's sum to
// the others. Every process sums in the same order, so all replicas end
// bit-identical.
//
// reduce_scatter and all_gather keep the interface's layout at a cost: a
// reduce_scatter is a whole all-reduce, and an all_gather is one broadcast
// per rank, each an all-reduce of the root's values and zeros (exact).
// Failure: every replica runs every stage, so a failure anywhere fails the
// collective on every replica of every process and leaves none waiting.
// The process's first replica carries a status float around the processes
// with the sums (1 where its process failed in its own group); a replica
// that fails, or learns of a failure, aborts its process's group, which
// ends the broadcast its process's other replicas wait in. The error says
// where: "hierarchical all-reduce: in this process: ...", "... across
// processes: ...", or "... a replica in another process failed". As with
// any group, it stays failed after that (build a new one to go on).
// abort() ends both groups.
//
// Sum and mean only (the mean's 1/size applied once, to the job's sum).
#include <memory>
#include <vector>

#include "collectives/process_group.hpp"

namespace troupe {

struct hierarchical_options {
  int rank = 0;  // in the whole group (the job's replica index)
  int size = 1;  // the job's replicas
  // Copies between the local group's memory and the host, when it is a
  // discrete device's (null: the host can read and write it).
  device_context* staging = nullptr;
};

// `across` is null on every replica but the process's first (local rank 0).
std::unique_ptr<process_group> make_hierarchical_group(std::unique_ptr<process_group> local,
                                                       std::shared_ptr<process_group> across,
                                                       hierarchical_options opts);

}  // namespace troupe
