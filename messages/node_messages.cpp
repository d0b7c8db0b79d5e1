#include "messages/node_messages.hpp"

namespace troupe {

void register_node_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<node_parts>("troupe::node_parts");
  cfg.add_message_type<node_build>("troupe::node_build");
  cfg.add_message_type<node_actor>("troupe::node_actor");
  cfg.add_message_type<std::vector<replica_actor>>("std::vector<troupe::replica_actor>");
  cfg.add_message_type<std::vector<variable_shard_actor>>(
      "std::vector<troupe::variable_shard_actor>");
}

}  // namespace troupe
