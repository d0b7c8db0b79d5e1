#pragma once
// Messages and protocols of the cross-process ring all-reduce
// (actors/reducers/remote_ring.hpp). Unlike the in-process reducers, the data
// travels in the messages: every chunk is a 1-D float32 tensor, serialized as
// one raw block when it crosses a process boundary.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "messages/messages.hpp"

namespace troupe {

using ring_chunk_atom = caf::atom_constant<caf::atom("rr_chunk")>;
using ring_credit_atom = caf::atom_constant<caf::atom("rr_credit")>;
using ring_abort_atom = caf::atom_constant<caf::atom("rr_abort")>;
using ring_wire_atom = caf::atom_constant<caf::atom("rr_wire")>;
using ring_timeout_atom = caf::atom_constant<caf::atom("rr_timeout")>;
using ring_hello_atom = caf::atom_constant<caf::atom("rr_hello")>;
using ring_known_atom = caf::atom_constant<caf::atom("rr_known")>;
using ring_offer_atom = caf::atom_constant<caf::atom("rr_offer")>;

// One chunk of one step of a ring collective, from a node to its right
// neighbour. Steps 0 .. P-2 are the reduce-scatter, P-1 .. 2P-3 the
// all-gather; the chunk covers elements [offset, offset + numel()) of the
// collective's flat buffer (the caller's tensors, concatenated).
//
// The floats are `pieces`: views of float32 memory owned by the tensors in
// `keep` (which keep it alive). The sender makes them views of its caller's
// buffers (no copy: serialization reads straight from them, and in one
// process the receiver reads them directly). The deserializer first asks the
// receiving node's ring_landing (below) to apply the floats straight from the
// received bytes to the collective's buffer; then the chunk carries no
// pieces, only `landed` = how many floats were applied. Otherwise (the
// collective has not started on the receiver, or no landing is registered)
// it makes one piece of a fresh, uninitialized tensor holding the floats.
// Serialized as the header fields, then the floats as one raw block.
struct ring_chunk {
  struct piece {
    const float* data = nullptr;
    int64_t len = 0;
  };
  uint64_t seq = 0;    // collective number on this group: 1, 2, ... in call order
  int32_t step = 0;    // see above
  int64_t offset = 0;  // first element
  int64_t total = 0;   // elements of the whole collective (checked: same on every rank)
  reduce_op op = reduce_op::sum;
  // The receiving node's actor id (in its own actor system), for the
  // deserializer to find its landing; 0: none.
  uint64_t dest = 0;
  // Receiving side only (not serialized): > 0 when the deserializer already
  // applied this many floats to the receiver's buffer (`pieces` is empty).
  int64_t landed = 0;
  std::vector<piece> pieces;
  std::vector<tensor> keep;

  // Floats in `pieces`.
  int64_t pieces_numel() const noexcept {
    int64_t n = 0;
    for (auto& p : pieces) n += p.len;
    return n;
  }
  // Floats the chunk covers (landed or in pieces).
  int64_t numel() const noexcept { return landed + pieces_numel(); }
};

// Where the deserializer of a process may put a received chunk's floats
// directly: a ring node registers one for itself (see remote_ring.cpp), so
// a chunk for the collective it is running is combined into the caller's
// buffer straight from CAF's receive buffer (on the middleman's thread),
// without an intermediate tensor.
class ring_landing {
 public:
  virtual ~ring_landing();
  // `x` holds the chunk's header fields; `f` is positioned at its `len`
  // floats. Returns false without touching `f` when the chunk cannot land
  // (the caller then deserializes the floats into a tensor); true once it
  // consumed the floats from `f` (applied, unless `err` is set).
  virtual bool land(const ring_chunk& x, int64_t len, caf::deserializer& f, caf::error& err) = 0;
};

// Registers `l` for the actor `id` of `sys` (null: removes it).
void set_ring_landing(const caf::actor_system& sys, uint64_t id, std::shared_ptr<ring_landing> l);

caf::error inspect(caf::serializer& f, ring_chunk& x);
caf::error inspect(caf::deserializer& f, ring_chunk& x);
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ring_chunk& x) {
  // Only for rendering (to_string); serialization uses the overloads above.
  int64_t n = x.numel();
  return f(caf::meta::type_name("ring_chunk"), x.seq, x.step, x.offset, x.total, x.op, n);
}

// What a ring node says to its peers (and all it accepts from them).
using ring_peer_actor = caf::typed_actor<
    // Data: one chunk from the left neighbour. Not answered by a reply: the
    // receiver grants a credit back once it has consumed the chunk.
    caf::reacts_to<ring_chunk_atom, ring_chunk>,
    // Flow control: the right neighbour consumed this many chunks (each link
    // carries at most `window` unacknowledged chunks).
    caf::reacts_to<ring_credit_atom, int32_t>,
    // Collective `seq` failed on rank `from` for `reason`; the group is
    // unusable from then on (every rank fails its pending work at once).
    caf::reacts_to<ring_abort_atom, uint64_t, int32_t, std::string>,
    // Direct links (runtime/process_ring.hpp): rank `from`, this node's right
    // neighbour, listens at host:port for this process's link to it and
    // hands over the link's key (over this authenticated link; accepted only
    // from that neighbour's node).
    caf::reacts_to<ring_offer_atom, int32_t, std::string, uint16_t, std::string>>;

// A ring node: one per process (or per test "process"), the peer protocol
// plus its owner's requests.
using ring_node_actor = ring_peer_actor::extend<
    // Wiring: this node is rank `rank` of the group `peers` (every rank's
    // node, in rank order, peers[rank] being this node; the others may be
    // remote proxies). Replies with the group size. Only once per node.
    caf::replies_to<ring_wire_atom, int32_t, std::vector<ring_peer_actor>>::with<int32_t>,
    // All-reduce the caller's float32 tensors IN PLACE; replies with them when
    // this rank's result is final. Every rank calls with the same total
    // number of elements and op, in the same order of collectives; every rank
    // ends with bit-identical results.
    caf::replies_to<allreduce_atom, reduce_op, std::vector<tensor>>::with<std::vector<tensor>>,
    // Counters (collectives, failed, buckets = chunks sent, messages_sent,
    // bytes_reduced).
    caf::replies_to<stats_atom>::with<reducer_stats>,
    // Internal: the timer of collective `seq` fired.
    caf::reacts_to<ring_timeout_atom, uint64_t>,
    // Joining: rank `rank` (a higher one, which connected to this node)
    // introduces its node. Only the higher rank of a pair connects: two nodes
    // connecting to each other at once make CAF drop one of the two
    // connections, and with it the proxies (remote_link_unreachable).
    caf::reacts_to<ring_hello_atom, int32_t, ring_peer_actor>,
    // Joining: the node rank `rank` introduced (an error until it has).
    caf::replies_to<ring_known_atom, int32_t>::with<ring_peer_actor>,
    // Direct links, from the owner: offer host:port and the key to the left
    // neighbour (once wired) ...
    caf::reacts_to<ring_offer_atom, std::string, uint16_t, std::string>,
    // ... and the offer rank `from` made to this node (an error until then).
    caf::replies_to<ring_offer_atom, int32_t>::with<std::string, uint16_t, std::string>>;

// Registers reduce_op, ring_chunk and the two handles with CAF (called by
// register_messages()).
void register_remote_ring_messages(caf::actor_system_config& cfg);

}  // namespace troupe
