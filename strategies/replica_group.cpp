// The collectives a strategy's replicas use (strategies/replica_group.hpp).
#include "strategies/replica_group.hpp"

#include <algorithm>
#include <cstdint>

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

// A holder of the replica's tensor that holds [p, p + n): one of its
// gradients, variables or optimizer slots (what the mirrored steps hand the
// collectives), or null. The reducer actors hold it for as long as one of
// them can touch the memory: a replica that stops frees its compute_state
// while a peer's reducer may still read its gradients (it stops reading
// only when it hears of the abort).
std::shared_ptr<const void> holder_if_within(const tensor& t, const float* p, std::size_t n) {
  if (t.type() != dtype::f32 || t.empty()) return nullptr;
  const auto a = reinterpret_cast<std::uintptr_t>(t.f32());
  const auto b = reinterpret_cast<std::uintptr_t>(p);
  if (b < a || b + n * sizeof(float) > a + t.nbytes()) return nullptr;
  return std::make_shared<const tensor>(t);
}

std::shared_ptr<const void> tensor_holding(compute_state& cs, const float* p, std::size_t n) {
  for (const auto& g : cs.grads)
    if (auto h = holder_if_within(g.value, p, n)) return h;
  if (cs.net)
    for (const auto& v : cs.net->variables())
      if (auto h = holder_if_within(v.value, p, n)) return h;
  if (cs.opt)
    for (std::size_t k = 0; k < cs.opt->slot_names().size(); ++k)
      for (const auto& t : cs.opt->slot_tensors(k))
        if (auto h = holder_if_within(t, p, n)) return h;
  return nullptr;
}

buffer_owner_fn owners_in(compute_state& cs) {
  // A pointer: the group is used only from the device thread, in tasks
  // that hold the compute_state.
  return [state = &cs](const float* p, std::size_t n) { return tensor_holding(*state, p, n); };
}

std::unique_ptr<process_group> actor_group(const caf::actor& a, int rank, int size,
                                           const replica_wiring& w, compute_state& cs) {
  reducer_group_options o;
  o.rank = rank;
  o.size = size;
  o.timeout = w.request_timeout;
  o.coalesce_bytes = static_cast<std::size_t>(std::max<int64_t>(1, w.bucket_bytes));
  o.buffer_owners = owners_in(cs);
  return make_reducer_group(a->home_system(), a, std::move(o));
}

// The group across processes of the process's first replica.
std::shared_ptr<process_group> group_across(const replica_wiring& w, compute_state& cs) {
  if (w.process_links) return w.process_links;
  return make_ring_node_group(w.ring, static_cast<int>(w.process_rank),
                              static_cast<int>(w.processes), w.request_timeout, owners_in(cs));
}

}  // namespace

std::shared_ptr<process_group> make_replica_group(const replica_wiring& w, compute_state& cs) {
  std::unique_ptr<process_group> local;
  if (w.device_group) {
    local = w.device_group->join(device_rank(w), *cs.dev);
    if (!w.across_processes || w.device_group_global) return local;
  } else {
    local = actor_group(caf::actor_cast<caf::actor>(w.reducer), static_cast<int>(w.local_index),
                        static_cast<int>(w.local_replicas), w, cs);
    if (!w.across_processes) return local;
  }
  hierarchical_options o;
  o.rank = static_cast<int>(w.index);
  o.size = static_cast<int>(w.replicas);
  if (w.device_group && cs.discrete()) o.staging = cs.dev.get();
  return make_hierarchical_group(std::move(local),
                                 w.local_index == 0 ? group_across(w, cs) : nullptr, o);
}

}  // namespace troupe
