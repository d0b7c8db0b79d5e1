#pragma once
// Setting up a process ring's direct links (runtime/process_ring.hpp)
// through the ring nodes that are already wired (actors/reducers/
// remote_ring.hpp): each process listens, offers host, port and a fresh key
// to its left neighbour as a typed message between the ring nodes (over the
// job's authenticated links), connects to its right neighbour's offer and
// accepts its left neighbour's connection.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "messages/remote_ring_messages.hpp"
#include "runtime/process_ring.hpp"

namespace troupe {

// How the links are made.
struct process_link_options {
  std::string bind_host;  // listen here (the task's host)
  bool encrypted = true;  // TLS 1.3 records (every job but cluster.insecure)
  // A link to a process of this host: a shared ring, a Unix socket or TCP.
  same_host_link same_host = same_host_link::unix_socket;
  ring_wire wire = ring_wire::fp32;
  // A waiting side yields its core this long before it sleeps.
  std::chrono::microseconds yield_for = idle_wait::default_yield_for;
};

// Rank `rank` of the ring of `tasks` (this process's task is tasks[rank]).
// Throws device_error naming the task that did not come by `deadline`.
std::shared_ptr<process_ring> join_process_links(caf::actor_system& sys,
                                                 const ring_node_actor& node, int32_t rank,
                                                 const std::vector<std::string>& tasks,
                                                 const process_link_options& how,
                                                 std::chrono::steady_clock::time_point deadline);

}  // namespace troupe
