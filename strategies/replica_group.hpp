#pragma once
// The collectives a strategy's replicas use, whatever runs them: what the
// job builds for them (make_collective_parts, from strategy.reducer and
// where the replicas are) and each replica's process_group over it
// (make_replica_group, on the replica's device thread). A strategy issues
// its collectives through the process_group (collectives/process_group.hpp)
// and never knows the backend:
//
//   strategy.reducer.algorithm   one process          across processes
//   "device"                     the device group     NCCL over the job (cuda), or
//                                (NCCL; the host      hierarchical: the device group,
//                                group on cpu, sim)   then the direct links (transport
//                                                     "direct") or the ring nodes
//   ring, tree, reduce_to_one    the reducer actors   hierarchical: the reducer actors,
//                                                     then the ring nodes
#include <memory>

#include "strategies/strategy.hpp"

namespace troupe {

// What a job's process builds for its replicas' collectives (a strategy's
// make_reducers).
reducer_parts make_collective_parts(caf::actor_system& sys, const job_config& c,
                                    const reducer_wiring& w);

// Replica w.index's group over the replicas of the job; on its device
// thread (an NCCL group joins there). Throws device_error naming the cause.
std::shared_ptr<process_group> make_replica_group(const replica_wiring& w, compute_state& cs);

}  // namespace troupe
