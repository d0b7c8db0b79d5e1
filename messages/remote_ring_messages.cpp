// CAF 0.17 registers std::vector<T> with every message type T; its loader for
// a vector of enums (std::vector<reduce_op>) trips a false
// -Wmaybe-uninitialized inside CAF's headers (data_processor::fill_range).
// This file holds nothing but the registrations, so the warning is off here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "messages/remote_ring_messages.hpp"

namespace troupe {

void register_remote_ring_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<reduce_op>("troupe::reduce_op");
  cfg.add_message_type<ring_chunk>("troupe::ring_chunk");
  cfg.add_message_type<ring_peer_actor>("troupe::ring_peer_actor");
  cfg.add_message_type<ring_node_actor>("troupe::ring_node_actor");
}

}  // namespace troupe
