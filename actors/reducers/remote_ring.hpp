#pragma once
// Ring all-reduce across processes: one ring node per process, data in the
// messages (chunks of float32 tensors, raw blocks on the wire), a bounded
// window of unacknowledged chunks per link (credit-based flow control).
//
// Peers are plain actor handles: the same code runs P nodes in one process
// (tests check the math that way) and P nodes in P processes, where the
// handles come from CAF's middleman (publish / remote_actor).
//
// Algorithm (rank r of P, flat buffer split into P segments, each segment
// into chunks of at most `chunk_bytes`):
//  - reduce-scatter, steps s = 0 .. P-2: r sends segment (r - s) mod P to
//    its right neighbour; a received chunk is combined into r's buffer and
//    forwarded at step s + 1; at step P-2 the segment (r + 1) mod P is final
//    on r (mean: scaled by 1/P);
//  - all-gather, steps P-1 .. 2P-3: final chunks are copied into the buffer
//    and forwarded until every rank holds them.
// Each segment is finalized by exactly one rank and only copied by the
// others, so every rank's result is bit-identical.
//
// Memory: chunks are views of the caller's buffers, never copies on the
// sending side (in another process, CAF serializes them straight from the
// buffer; in one process, the receiver combines straight from the sender's
// buffer). A chunk from another process for the collective the receiver is
// running is combined into the caller's buffer by the deserializer, straight
// from CAF's receive buffer (ring_landing); one that arrives before its
// collective started is deserialized into an uninitialized buffer and
// combined from it later. Per link at most `window` chunks are in
// flight (sender's BASP buffers + receiver's mailbox); chunks of a
// collective this rank has not started yet stay unacknowledged, hence also
// bounded by the window. A collective's reply is sent only once all its
// chunks are acknowledged by the right neighbour (so consumed, hence
// serialized), so the caller may reuse the tensors at once. After a failure
// the reply (an error) may come before chunks still queued in CAF were
// serialized: the group is broken then, whatever they carry.
//
// Failure: a node monitors every peer; a peer's down_msg (in another process:
// exit_reason remote_link_unreachable, ~1 ms after the process dies; a hung
// process needs middleman heartbeats, see actors/net_system_config.hpp) fails the
// pending and queued collectives at once with an error naming the rank, and
// tells the other ranks (ring_abort). Every collective also has a timeout.
// After a failure the group is broken: later requests fail at once with the
// same reason (build a new group to go on).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "messages/remote_ring_messages.hpp"

namespace troupe {

struct ring_options {
  // Payload bytes per chunk message (rounded down to whole floats, >= 4).
  int64_t chunk_bytes = int64_t{1} << 20;
  // Unacknowledged chunks per link.
  int32_t window = 8;
  // A collective not finished this long after it started on this rank fails.
  caf::timespan timeout = std::chrono::seconds(60);
  // Where the actor system has the middleman loaded, run the node on the
  // middleman's thread (as a broker): a chunk from another process is then
  // combined (while deserialized), acknowledged and forwarded on that one
  // thread, without waking an actor thread twice per chunk.
  bool on_middleman_thread = true;
};

ring_node_actor spawn_ring_node(caf::actor_system& sys, ring_options opts = {});

// --- wiring across processes (needs the middleman loaded) ---

// Publishes `node` on `port` (0: the OS picks one) at address `bind`
// ("" = every interface); returns the bound port.
caf::expected<uint16_t> publish_ring_node(caf::actor_system& sys, const ring_node_actor& node,
                                          uint16_t port, const std::string& bind = "127.0.0.1");

// Connects to the ring node published at host:port, retrying refused
// connections until `timeout` (the peer process may not have published yet).
caf::expected<ring_peer_actor> connect_ring_peer(caf::actor_system& sys, const std::string& host,
                                                 uint16_t port,
                                                 caf::timespan timeout = std::chrono::seconds(10));

// Wires `node` as rank `rank` of `peers` (blocking request with `timeout`).
caf::error wire_ring_node(caf::actor_system& sys, const ring_node_actor& node, int32_t rank,
                          std::vector<ring_peer_actor> peers,
                          caf::timespan timeout = std::chrono::seconds(10));

// The rendezvous of a ring across processes, whatever reaches a peer: each
// pair of nodes gets one connection, opened by the higher rank, which finds
// every lower rank's node (`find_lower(p)`) and introduces itself to it; a
// node learns the higher ranks from their introductions, waiting for them
// until `deadline` (the error names the missing one by `rank_name(p)`). Then
// `node` is wired as `rank` of `size`. What find_lower throws passes through.
using ring_peer_finder = std::function<caf::expected<ring_peer_actor>(int32_t rank)>;
caf::error rendezvous_ring(caf::actor_system& sys, const ring_node_actor& node, int32_t rank,
                           int32_t size, const ring_peer_finder& find_lower,
                           const std::function<std::string(int32_t)>& rank_name,
                           std::chrono::steady_clock::time_point deadline,
                           caf::timespan wire_timeout = std::chrono::seconds(10));

// All of it for one process of a group whose nodes are published at
// `addresses` (host, port), in rank order: connects to every other rank and
// wires `node` as `rank` (addresses[rank] is not contacted).
// `connect` reaches a lower rank's node (default: connect_ring_peer; a
// process behind a gate, net/gate.hpp, passes gate_remote_actor).
using ring_connector =
    std::function<caf::expected<ring_peer_actor>(const std::string&, uint16_t, caf::timespan)>;
caf::error join_ring(caf::actor_system& sys, const ring_node_actor& node, int32_t rank,
                     const std::vector<std::pair<std::string, uint16_t>>& addresses,
                     caf::timespan timeout = std::chrono::seconds(10),
                     const ring_connector& connect = {});

// --- in one process ---

// Spawns and wires n nodes (tests, or several groups in one process), as
// plain actors (on_middleman_thread is ignored: nothing is deserialized).
std::vector<ring_node_actor> spawn_ring_group(caf::actor_system& sys, int n,
                                              ring_options opts = {});

// Nodes of a group hold each other's handles, so they live until told to
// stop (or until the group fails): send them an exit (user_shutdown).
void stop_ring_nodes(const std::vector<ring_node_actor>& nodes);

// Blocking all-reduce through `node` (a scoped_actor request with `timeout`).
caf::expected<std::vector<tensor>> ring_allreduce(caf::actor_system& sys,
                                                  const ring_node_actor& node, reduce_op op,
                                                  std::vector<tensor> tensors,
                                                  caf::timespan timeout = std::chrono::seconds(60));

}  // namespace troupe
