// The collectives a strategy's replicas use (strategies/replica_group.hpp).
#include "strategies/replica_group.hpp"

#include <algorithm>

#include "actors/reducer_group.hpp"
#include "collectives/hierarchical_group.hpp"
#include "collectives/nccl_id.hpp"

namespace troupe {

reducer_parts make_collective_parts(caf::actor_system& sys, const job_config& c,
                                    const reducer_wiring& w) {
  reducer_parts out;
  if (c.strategy.reducer.algorithm == reducer_algorithm::device && !w.device_group_id.empty()) {
    nccl_unique_id id{};
    if (w.device_group_id.size() != id.size())
      throw job_error("the build order's NCCL group id has " +
                      std::to_string(w.device_group_id.size()) + " bytes, expected " +
                      std::to_string(id.size()));
    std::copy(w.device_group_id.begin(), w.device_group_id.end(), id.begin());
    out.device_group = make_nccl_rendezvous(static_cast<int>(c.strategy.replicas), id);
    out.device_group_global = true;
    return out;
  }
  if (c.strategy.reducer.algorithm == reducer_algorithm::device) {
    out.device_group = make_device_rendezvous(w.local_replicas, parse_device(c.devices.front()));
    return out;
  }
  out.per_replica = spawn_reducer_group(sys, w.local_replicas, reducer_config_of(c));
  return out;
}

namespace {

// The replica's rank in its device group: the job's replica index in one
// NCCL group over the job, else its index in the process.
int device_rank(const replica_wiring& w) {
  return static_cast<int>(w.device_group_global ? w.index : w.local_index);
}

std::unique_ptr<process_group> actor_group(const caf::actor& a, int rank, int size,
                                           const replica_wiring& w) {
  reducer_group_options o;
  o.rank = rank;
  o.size = size;
  o.timeout = w.request_timeout;
  o.coalesce_bytes = static_cast<std::size_t>(std::max<int64_t>(1, w.bucket_bytes));
  return make_reducer_group(a->home_system(), a, std::move(o));
}

// The group across processes of the process's first replica.
std::shared_ptr<process_group> group_across(const replica_wiring& w) {
  if (w.process_links) return w.process_links;
  return make_ring_node_group(w.ring, static_cast<int>(w.process_rank),
                              static_cast<int>(w.processes), w.request_timeout);
}

}  // namespace

std::shared_ptr<process_group> make_replica_group(const replica_wiring& w, compute_state& cs) {
  std::unique_ptr<process_group> local;
  if (w.device_group) {
    local = w.device_group->join(device_rank(w), *cs.dev);
    if (!w.across_processes || w.device_group_global) return local;
  } else {
    local = actor_group(caf::actor_cast<caf::actor>(w.reducer), static_cast<int>(w.local_index),
                        static_cast<int>(w.local_replicas), w);
    if (!w.across_processes) return local;
  }
  hierarchical_options o;
  o.rank = static_cast<int>(w.index);
  o.size = static_cast<int>(w.replicas);
  if (w.device_group && cs.discrete()) o.staging = cs.dev.get();
  return make_hierarchical_group(std::move(local), w.local_index == 0 ? group_across(w) : nullptr,
                                 o);
}

}  // namespace troupe
