#include "messages/rl_messages.hpp"

namespace troupe {

void register_rl_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<unroll>("troupe::unroll");
  cfg.add_message_type<std::vector<unroll>>("std::vector<troupe::unroll>");
  cfg.add_message_type<queue_stats>("troupe::queue_stats");
  cfg.add_message_type<trajectory_queue_actor>("troupe::trajectory_queue_actor");
}

}  // namespace troupe
